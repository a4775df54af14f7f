/*
 * Coroutine synchronisation on one event loop: a wait queue and a mutex.
 * Waking never switches immediately; woken coroutines run from the loop,
 * so a waker keeps running until it yields.
 */
#ifndef QK_AIO_CO_SYNC_H
#define QK_AIO_CO_SYNC_H

#include <stdbool.h>

#include "aio/coroutine.h"

/* QkCoQueue, QK_CO_QUEUE_INIT, qk_co_queue_wait (waits until woken) and
 * qk_co_queue_wake_all are in qcowkit/engine.h. */

static inline void qk_co_queue_init(QkCoQueue *q) { q->head = q->tail = NULL; }
static inline bool qk_co_queue_empty(const QkCoQueue *q) { return q->head == NULL; }
/* Wakes the first waiter; returns false if there was none. */
bool qk_co_queue_wake_one(QkCoQueue *q);

typedef struct QkCoMutex {
    bool locked;
    QkCoroutine *holder;
    QkCoQueue waiters;
} QkCoMutex;

static inline void qk_co_mutex_init(QkCoMutex *m) { m->locked = false; m->holder = NULL; qk_co_queue_init(&m->waiters); }
void coroutine_fn qk_co_mutex_lock(QkCoMutex *m);
void qk_co_mutex_unlock(QkCoMutex *m);

#endif
