/*
 * Copy buffers for a job: equal slots of one large region, handed out and
 * taken back (buf_slots.c). The region comes from qk_io_buf_alloc, so a
 * direct request from a slot reaches the disk whole (see util/iov.c).
 */
#ifndef QK_UTIL_BUF_SLOTS_H
#define QK_UTIL_BUF_SLOTS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct QkBufSlots {
    size_t align, slot;  /* each slot's alignment and size */
    int count;           /* slots in the region */
    void *region;        /* allocated on the first get */
    void **free;         /* free slots of region */
    int nfree;
    int out;             /* region slots handed out */
} QkBufSlots;

/* count slots of size bytes (rounded up to align); nothing is allocated
 * until the first get. -ENOMEM or 0. */
int qk_buf_slots_init(QkBufSlots *s, size_t align, size_t size, int count);
/* A slot, or (all taken, or the region could not be had) a buffer of the
 * same size allocated on its own; NULL when out of memory. */
void *qk_buf_slots_get(QkBufSlots *s);
/* Gives back what get returned (NULL is ignored). */
void qk_buf_slots_put(QkBufSlots *s, void *buf);
/* Frees the region once every slot is back: an idle job keeps no memory. */
void qk_buf_slots_release(QkBufSlots *s);
/* release, and the slot list. */
void qk_buf_slots_destroy(QkBufSlots *s);

#endif
