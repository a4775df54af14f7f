/*
 * Completions from foreign threads (the work pool's workers): a one-shot
 * event a thread signals and a coroutine waits for. The wait is an
 * ordinary asynchronous read of an eventfd
 * through the loop's backend, so the loop keeps serving I/O meanwhile.
 * Eventfds are kept for reuse across events and loops.
 */
#ifndef QK_AIO_THREAD_EVENT_H
#define QK_AIO_THREAD_EVENT_H

#include "aio/coroutine.h"

typedef struct QkThreadEvent {
    int fd;
} QkThreadEvent;

/* Readies ev for one signal; -errno when no eventfd can be had. */
int qk_thread_event_init(QkThreadEvent *ev);
/* From any thread, once per init: wakes the waiter. Async-signal-safe. */
void qk_thread_event_signal(QkThreadEvent *ev);
/* Waits for the signal, yielding to the loop, then releases ev. */
void coroutine_fn qk_co_thread_event_wait(QkThreadEvent *ev);
/* Releases an event that was never signalled nor waited for. */
void qk_thread_event_destroy(QkThreadEvent *ev);

#endif
