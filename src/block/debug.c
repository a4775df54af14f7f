/*
 * Breakpoint registry for qk_block_debug_event(). Breakpoints are global to
 * the thread's loop: tests drive one image at a time through `qcowkit io`.
 */
#include "block/debug.h"
#include "aio/co_sync.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[QK_DBG__COUNT] = {
    [QK_DBG_WRITE_AIO] = "write_aio",
    [QK_DBG_WRITE_DONE] = "write_done",
    [QK_DBG_COW_READ] = "cow_read",
    [QK_DBG_COW_WRITE] = "cow_write",
    [QK_DBG_CLUSTER_ALLOC] = "cluster_alloc",
    [QK_DBG_L2_UPDATE] = "l2_update",
    [QK_DBG_REFBLOCK_UPDATE] = "refblock_update",
    [QK_DBG_READ_AIO] = "read_aio",
    [QK_DBG_FLUSH] = "flush",
    [QK_DBG_DIRECT_WRITE] = "direct_write",
};

typedef struct Break {
    QkDebugEvent ev;
    char *tag;
    bool fired;              /* a request is paused here */
    QkCoroutine *paused;
    QkCoQueue waiters;       /* wait_break callers */
    struct Break *next;
} Break;

int qk_debug_armed;
static Break *breaks;

int qk_debug_event_parse(const char *name)
{
    for (int i = 0; i < QK_DBG__COUNT; i++) {
        if (strcmp(names[i], name) == 0) {
            return i;
        }
    }
    return -1;
}

const char *qk_debug_event_name(QkDebugEvent ev)
{
    return ev < QK_DBG__COUNT ? names[ev] : "?";
}

static Break *find(const char *tag)
{
    for (Break *b = breaks; b; b = b->next) {
        if (strcmp(b->tag, tag) == 0) {
            return b;
        }
    }
    return NULL;
}

static void unlink_free(Break *b)
{
    for (Break **pp = &breaks; *pp; pp = &(*pp)->next) {
        if (*pp == b) {
            *pp = b->next;
            break;
        }
    }
    free(b->tag);
    free(b);
}

int qk_debug_break(int ev, const char *tag)
{
    if (find(tag)) {
        return -EEXIST;
    }
    Break *b = calloc(1, sizeof(*b));
    if (!b || !(b->tag = strdup(tag))) {
        free(b);
        return -ENOMEM;
    }
    b->ev = ev;
    qk_co_queue_init(&b->waiters);
    b->next = breaks;
    breaks = b;
    qk_debug_armed++;
    return 0;
}

int qk_debug_remove_break(const char *tag)
{
    Break *b = find(tag);
    if (!b || b->fired) {
        return -ENOENT;
    }
    qk_debug_armed--;
    unlink_free(b);
    return 0;
}

void coroutine_fn qk_debug_event_slow(QkDebugEvent ev)
{
    for (Break *b = breaks; b; b = b->next) {
        if (b->ev == ev && !b->fired) {
            b->fired = true;
            b->paused = qk_coroutine_self();
            qk_debug_armed--;
            qk_co_queue_wake_all(&b->waiters);
            qk_coroutine_yield(); /* until qk_debug_resume */
            unlink_free(b);
            return;
        }
    }
}

void coroutine_fn qk_debug_wait_break(const char *tag)
{
    Break *b;
    while ((b = find(tag)) && !b->fired) {
        qk_co_queue_wait(&b->waiters);
    }
}

bool qk_debug_is_paused(const char *tag)
{
    Break *b = find(tag);
    return b && b->fired;
}

int qk_debug_resume(const char *tag)
{
    Break *b = find(tag);
    if (!b || !b->fired) {
        return -ENOENT;
    }
    QkCoroutine *co = b->paused;
    b->paused = NULL;
    qk_coroutine_wake(co);
    return 0;
}
