/*
 * Task pool: runs coroutine tasks with at most `max` of them at once.
 *
 * Starting a task waits for a free slot. qk_task_pool_wait_slot() and
 * qk_task_pool_wait_all() may be called by any coroutine, by several at
 * once; they are separate wake-ups: a slot waiter wakes whenever any task
 * finishes, an all-waiter only when no task is busy. The first error a task
 * returns is kept and reported by qk_task_pool_status(); later tasks still
 * run to completion.
 */
#ifndef QK_AIO_TASK_POOL_H
#define QK_AIO_TASK_POOL_H

#include <stdbool.h>

#include "aio/co_sync.h"

typedef struct QkTaskPool QkTaskPool;
/* A task returns 0 or -errno. */
typedef int coroutine_fn QkTaskFn(void *opaque);

QkTaskPool *qk_task_pool_new(int max_busy);
/* Frees the pool; it must be idle (call wait_all first). */
void qk_task_pool_free(QkTaskPool *pool);

/* Waits for a free slot, then starts fn(opaque) in a new coroutine. */
void coroutine_fn qk_task_pool_start(QkTaskPool *pool, QkTaskFn *fn, void *opaque);
/* Waits until fewer than max tasks are busy (returns at once if so). */
void coroutine_fn qk_task_pool_wait_slot(QkTaskPool *pool);
/* Waits until no task is busy. */
void coroutine_fn qk_task_pool_wait_all(QkTaskPool *pool);

/* 0, or the first error any task returned. */
int qk_task_pool_status(const QkTaskPool *pool);
bool qk_task_pool_empty(const QkTaskPool *pool);
int qk_task_pool_busy(const QkTaskPool *pool);
int qk_task_pool_max(const QkTaskPool *pool);
void qk_task_pool_set_max(QkTaskPool *pool, int max_busy);

#endif
