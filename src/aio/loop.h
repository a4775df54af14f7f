/*
 * The event loop: one per thread. It runs woken coroutines and callbacks,
 * fires timers, watches file descriptors, and completes host I/O through
 * the selected backend (io_uring by default, a thread pool as fallback).
 */
#ifndef QK_AIO_LOOP_H
#define QK_AIO_LOOP_H

#include <stdbool.h>
#include <stdint.h>

#include "aio/coroutine.h"

/* qcowkit/engine.h declares what programs use: QkLoop, qk_loop_get,
 * qk_loop_destroy_current, qk_loop_backend_name, qk_loop_run_until,
 * qk_co_run, qk_clock_ns, qk_co_sleep_ns and qk_co_wait_fd. */

typedef enum QkAioBackendKind {
    QK_AIO_DEFAULT = 0, /* io_uring, falling back to threads */
    QK_AIO_IO_URING,
    QK_AIO_THREADS,
} QkAioBackendKind;

/* Chooses the backend for loops created afterwards; "io_uring"/"threads".
 * Returns 0 or -EINVAL for an unknown name (qk_set_aio_backend). */
int qk_aio_set_backend_name(const char *name);
void qk_aio_set_backend(QkAioBackendKind kind);

/* This thread's loop, made on first use: 0, or -errno when it cannot be
 * set up (out of descriptors, memory or threads). Entry points that can
 * report an error call it first; qk_loop_get() aborts instead. */
int qk_loop_try_get(QkLoop **out);

/* A user that keeps a pointer to LOOP across calls (an inline async image)
 * pins it, so the thread's exit does not free it under the user. */
void qk_loop_pin(QkLoop *loop);
void qk_loop_unpin(QkLoop *loop);

/* Runs one iteration; when blocking, waits for at least one event if
 * nothing is ready. Returns true if anything was done. */
bool qk_loop_run_once(QkLoop *loop, bool blocking);

/* For programs that drive a loop from their own poll loop (the async
 * API's inline images): a descriptor that is readable whenever the loop
 * has an event to handle (an I/O completion or a watched fd), and the time
 * until its earliest timer (-1: none), which no descriptor reports. */
int qk_loop_poll_fd(QkLoop *loop);
int64_t qk_loop_next_timer_ns(QkLoop *loop);

/* Callback to run on the next iteration (like a bottom half). */
typedef void QkCallback(void *opaque);
void qk_loop_call_soon(QkLoop *loop, QkCallback *cb, void *opaque);

/* Wakes a coroutine blocked in qk_co_wait_fd on fd with -ECANCELED. */
void qk_loop_cancel_fd_wait(QkLoop *loop, int fd);

/* Internal: used by coroutine.c and the backends. */
void qk_loop_schedule_co(QkLoop *loop, QkCoroutine *co);
void qk_coroutine_run_scheduled(QkCoroutine *co);
QkCoroutine **qk_coroutine_wake_next(QkCoroutine *co);

#endif
