/*
 * Debug breakpoints for deterministic race tests. Drivers announce named
 * points on their request paths with qk_block_debug_event(); a test sets a
 * breakpoint on an event with a tag (`break EVENT TAG` in `qcowkit io`), the
 * next request reaching that event pauses there, `wait_break TAG` waits
 * until one has, and `resume TAG` lets it go on. With no breakpoint set an
 * event costs one pointer test.
 */
#ifndef QK_BLOCK_DEBUG_H
#define QK_BLOCK_DEBUG_H

#include <stdbool.h>

#include "aio/coroutine.h"
#include "qcowkit/engine.h"

typedef enum QkDebugEvent {
    QK_DBG_WRITE_AIO,       /* a data write to the host is about to be issued */
    QK_DBG_WRITE_DONE,      /* a guest write's data has reached the host, before metadata */
    QK_DBG_COW_READ,        /* copy-on-write: reading the old data */
    QK_DBG_COW_WRITE,       /* copy-on-write: writing the edges */
    QK_DBG_CLUSTER_ALLOC,   /* a new host cluster was allocated */
    QK_DBG_L2_UPDATE,       /* L2 entries are about to be updated */
    QK_DBG_REFBLOCK_UPDATE, /* a refcount block was just written, nothing after it yet */
    QK_DBG_READ_AIO,        /* a data read from the host is about to be issued */
    QK_DBG_FLUSH,           /* a flush is about to reach the host */
    QK_DBG_DIRECT_WRITE,    /* file: an O_DIRECT write is tracked, about to reach the host */
    QK_DBG__COUNT,
} QkDebugEvent;

/* Parsing names ("write_aio", "cow_write", ...), arming a one-shot
 * breakpoint (an event as QkDebugEvent), waiting for and resuming a
 * paused request: declared in qcowkit/engine.h. */
const char *qk_debug_event_name(QkDebugEvent ev);

bool qk_debug_is_paused(const char *tag);

/* Called by drivers at named points; pauses when a breakpoint matches. */
extern int qk_debug_armed; /* number of breakpoints set, for a cheap check */
void coroutine_fn qk_debug_event_slow(QkDebugEvent ev);
static inline void coroutine_fn qk_block_debug_event(QkDebugEvent ev)
{
    if (qk_debug_armed) {
        qk_debug_event_slow(ev);
    }
}

#endif
