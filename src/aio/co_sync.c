/*
 * Wait queues and mutexes for coroutines. Waiters live on their own stacks
 * (QkCoWaiter), so queues need no allocation.
 */
#include "aio/co_sync.h"

#include <assert.h>

void coroutine_fn qk_co_queue_wait(QkCoQueue *q)
{
    QkCoWaiter w = {qk_coroutine_self(), NULL};
    assert(w.co);
    if (q->tail) {
        q->tail->next = &w;
    } else {
        q->head = &w;
    }
    q->tail = &w;
    qk_coroutine_yield();
}

bool qk_co_queue_wake_one(QkCoQueue *q)
{
    QkCoWaiter *w = q->head;
    if (!w) {
        return false;
    }
    q->head = w->next;
    if (!q->head) {
        q->tail = NULL;
    }
    qk_coroutine_wake(w->co);
    return true;
}

void qk_co_queue_wake_all(QkCoQueue *q)
{
    QkCoWaiter *w = q->head;
    q->head = q->tail = NULL;
    while (w) {
        QkCoWaiter *next = w->next; /* w may vanish once its coroutine runs */
        qk_coroutine_wake(w->co);
        w = next;
    }
}

void coroutine_fn qk_co_mutex_lock(QkCoMutex *m)
{
    QkCoroutine *self = qk_coroutine_self();
    /* Ownership passes directly from the unlocker to the first waiter, so a
     * newcomer cannot overtake a woken waiter (fairness). */
    if (!m->locked) {
        m->locked = true;
        m->holder = self;
        return;
    }
    qk_co_queue_wait(&m->waiters);
    assert(m->holder == self);
}

void qk_co_mutex_unlock(QkCoMutex *m)
{
    assert(m->locked);
    QkCoWaiter *w = m->waiters.head;
    if (!w) {
        m->locked = false;
        m->holder = NULL;
        return;
    }
    m->holder = w->co;
    qk_co_queue_wake_one(&m->waiters);
}
