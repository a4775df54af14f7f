/*
 * Job copy buffers as slots of one region (buf_slots.h). Buffers
 * allocated one by one for direct I/O sat on scattered 4 KiB pages and
 * their requests reached the disk split; a fresh allocation per copy was
 * also an mmap whose pages all faulted in and whose munmap shot down TLBs
 * on every CPU. One region, kept while the job runs, avoids both.
 */
#include "util/buf_slots.h"
#include "common/checked.h"
#include "util/iov.h"
#include "qcowkit/engine.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

int qk_buf_slots_init(QkBufSlots *s, size_t align, size_t size, int count)
{
    *s = (QkBufSlots){.align = align, .slot = (size_t)qk_align_up(size, align), .count = count};
    s->free = calloc(count > 0 ? (size_t)count : 1, sizeof(*s->free));
    return s->free ? 0 : -ENOMEM;
}

static bool in_region(const QkBufSlots *s, const void *buf)
{
    const char *p = buf, *r = s->region;
    return r && p >= r && p < r + s->slot * (size_t)s->count;
}

void *qk_buf_slots_get(QkBufSlots *s)
{
    if (!s->region && s->count > 0) {
        s->region = qk_io_buf_alloc(s->align, s->slot * (size_t)s->count);
        s->nfree = 0;
        for (int i = s->count - 1; s->region && i >= 0; i--) {
            s->free[s->nfree++] = (char *)s->region + (size_t)i * s->slot;
        }
        s->out = 0;
    }
    if (s->nfree > 0) {
        s->out++;
        return s->free[--s->nfree];
    }
    return qk_aligned_alloc(s->align, s->slot);
}

void qk_buf_slots_put(QkBufSlots *s, void *buf)
{
    if (buf && in_region(s, buf)) {
        s->free[s->nfree++] = buf;
        s->out--;
    } else {
        free(buf);
    }
}

void qk_buf_slots_release(QkBufSlots *s)
{
    if (s->region && s->out == 0) {
        free(s->region);
        s->region = NULL;
        s->nfree = 0;
    }
}

void qk_buf_slots_destroy(QkBufSlots *s)
{
    qk_buf_slots_release(s);
    free(s->free);
    s->free = NULL;
}
