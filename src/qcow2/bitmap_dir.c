/*
 * The persistent dirty bitmaps' directory (the bitmaps header extension),
 * read at open for `info`: each bitmap's name, granularity and flags.
 * Nothing here writes. An open that will change the image clears the
 * bitmaps' autoclear bit (qcow2.c), after which QEMU ignores them too and
 * the list is dropped.
 */
#include "qcow2/qcow2_int.h"

#include <stdlib.h>
#include <string.h>

#define BME_FLAG_IN_USE 1u
#define BME_FLAG_AUTO 2u
#define BME_FIXED 24u
/* Bounds QEMU sets on a directory it loads. */
#define MAX_DIR_BYTES (64u << 20)
#define MAX_BITMAPS 65535u
#define MAX_NAME 1023u

void qcow2_bitmaps_free_list(Qcow2State *s)
{
    for (int i = 0; i < s->nb_bitmaps; i++) {
        free(s->bitmaps[i].name);
    }
    free(s->bitmaps);
    s->bitmaps = NULL;
    s->nb_bitmaps = 0;
}

/* Parses dir (len bytes, n entries) into s->bitmaps; -QK_ECORRUPT when an
 * entry does not fit. */
static int parse(Qcow2State *s, const uint8_t *dir, uint64_t len, uint32_t n)
{
    s->bitmaps = calloc(n ? n : 1, sizeof(*s->bitmaps));
    if (!s->bitmaps) {
        return -ENOMEM;
    }
    uint64_t p = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (p + BME_FIXED > len) {
            return -QK_ECORRUPT;
        }
        uint32_t flags = qk_be32_get(dir + p + 12);
        uint8_t gbits = dir[p + 17];
        uint16_t name_len = qk_be16_get(dir + p + 18);
        uint32_t extra = qk_be32_get(dir + p + 20);
        uint64_t name_at = p + BME_FIXED + extra;
        if (name_len > MAX_NAME || gbits > 63 || name_at + name_len > len) {
            return -QK_ECORRUPT;
        }
        QkBitmapInfo *b = &s->bitmaps[s->nb_bitmaps];
        b->name = strndup((const char *)dir + name_at, name_len);
        if (!b->name) {
            return -ENOMEM;
        }
        s->nb_bitmaps++;
        b->granularity = 1ULL << gbits;
        b->in_use = flags & BME_FLAG_IN_USE;
        b->auto_enabled = flags & BME_FLAG_AUTO;
        p = qk_align_up(name_at + name_len, 8);
    }
    return 0;
}

int coroutine_fn qcow2_bitmaps_load_list(Qcow2State *s)
{
    if (!(s->h.autoclear_features & QCOW2_AUTOCLEAR_BITMAPS)) {
        for (Qcow2Ext *e = s->exts; e; e = e->next) {
            s->bitmaps_stale |= e->type == QCOW2_EXT_BITMAPS;
        }
        return 0;
    }
    for (Qcow2Ext *e = s->exts; e; e = e->next) {
        if (e->type != QCOW2_EXT_BITMAPS || e->len < 24) {
            continue;
        }
        uint32_t n = qk_be32_get(e->data);
        uint64_t len = qk_be64_get(e->data + 8), off = qk_be64_get(e->data + 16);
        if (n == 0 || n > MAX_BITMAPS || len > MAX_DIR_BYTES || len < (uint64_t)n * BME_FIXED ||
            !qk_is_aligned(off, s->cluster_size) || !qk_range_within(off, len, s->file_size)) {
            return -QK_ECORRUPT;
        }
        uint8_t *dir = malloc(len);
        if (!dir) {
            return -ENOMEM;
        }
        int r = qk_co_pread(s->bs->file, off, len, dir, 0);
        if (r == 0) {
            r = parse(s, dir, len, n);
        }
        free(dir);
        if (r < 0) {
            qcow2_bitmaps_free_list(s);
        }
        return r;
    }
    return 0;
}
