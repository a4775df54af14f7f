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

typedef struct QkLoop QkLoop;

typedef enum QkAioBackendKind {
    QK_AIO_DEFAULT = 0, /* io_uring, falling back to threads */
    QK_AIO_IO_URING,
    QK_AIO_THREADS,
} QkAioBackendKind;

/* Chooses the backend for loops created afterwards; "io_uring"/"threads".
 * Returns 0 or -EINVAL for an unknown name. */
int qk_aio_set_backend_name(const char *name);
void qk_aio_set_backend(QkAioBackendKind kind);
/* Name of the backend the current thread's loop actually uses. */
const char *qk_loop_backend_name(QkLoop *loop);

/* The calling thread's loop, created on first use. */
QkLoop *qk_loop_get(void);
void qk_loop_destroy_current(void);

/* Runs one iteration; when blocking, waits for at least one event if
 * nothing is ready. Returns true if anything was done. */
bool qk_loop_run_once(QkLoop *loop, bool blocking);
/* Runs the loop until *done becomes true. */
void qk_loop_run_until(QkLoop *loop, const bool *done);

/* Runs entry(opaque) as a coroutine and drives the loop until it returns.
 * From plain code only (not from a coroutine). */
void qk_co_run(QkCoroutineEntry *entry, void *opaque);

/* Callback to run on the next iteration (like a bottom half). */
typedef void QkCallback(void *opaque);
void qk_loop_call_soon(QkLoop *loop, QkCallback *cb, void *opaque);

/* Timers: monotonic nanoseconds. */
int64_t qk_clock_ns(void);
void coroutine_fn qk_co_sleep_ns(int64_t ns);

/* File descriptor readiness for coroutines: waits until fd is readable
 * (events=POLLIN) or writable (POLLOUT). Returns the ready events, or
 * -ETIMEDOUT after timeout_ns (timeout_ns < 0: wait forever). */
int coroutine_fn qk_co_wait_fd(int fd, int events, int64_t timeout_ns);
/* Wakes a coroutine blocked in qk_co_wait_fd on fd with -ECANCELED. */
void qk_loop_cancel_fd_wait(QkLoop *loop, int fd);

/* Internal: used by coroutine.c and the backends. */
void qk_loop_schedule_co(QkLoop *loop, QkCoroutine *co);
void qk_coroutine_run_scheduled(QkCoroutine *co);
QkCoroutine **qk_coroutine_wake_next(QkCoroutine *co);

#endif
