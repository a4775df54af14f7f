/*
 * CPU work off the event loop: qk_co_run_in_thread() hands a function to
 * one of the process's worker threads and yields until it has returned,
 * so a loop keeps serving I/O while clusters are compressed. The pool is
 * shared by every loop of the process and made on first use.
 */
#ifndef QK_AIO_WORK_POOL_H
#define QK_AIO_WORK_POOL_H

#include "aio/coroutine.h"

/* qk_work_pool_set_threads (qcowkit/engine.h): worker threads at most (0:
 * one per online CPU, the default), for threads started after the call. */

/* Runs fn(arg) on a worker thread (inline when no thread can be had) and
 * returns when it is done. fn must not touch the loop or coroutines. */
void coroutine_fn qk_co_run_in_thread(void (*fn)(void *), void *arg);

#endif
