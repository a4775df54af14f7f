/*
 * Stackful coroutines with pooled stacks.
 *
 * Functions whose names start with qk_co_ (or are marked "coroutine_fn")
 * may yield: they must be called from a coroutine. A coroutine runs until it
 * yields or returns; it is resumed by qk_coroutine_enter() (now, nested in
 * the caller) or qk_coroutine_wake() (later, from the event loop).
 * Switching is a handful of register moves: no system call.
 */
#ifndef QK_AIO_COROUTINE_H
#define QK_AIO_COROUTINE_H

#include <stdbool.h>
#include <stddef.h>

#include "qcowkit/engine.h"

/* In qcowkit/engine.h: coroutine_fn, QkCoroutine, qk_coroutine_create()
 * (runs entry(opaque) when first entered) and qk_coroutine_enter()
 * (switches into co until it yields or finishes; a finished coroutine's
 * stack goes back to the pool and co must not be used afterwards). */

/* Schedules co to be entered from the event loop (safe from anywhere on
 * the loop's thread, including from inside co itself before it yields). */
void qk_coroutine_wake(QkCoroutine *co);
/* Returns to whoever entered the current coroutine. */
void coroutine_fn qk_coroutine_yield(void);
QkCoroutine *qk_coroutine_self(void);
/* Marks the current coroutine (and those it creates from now on) as
 * background work: its host I/O runs on the loop's low-priority pool. */
void qk_coroutine_set_background(bool on);
bool qk_coroutine_is_background(void);
bool qk_in_coroutine(void);

/* Statistics and tuning. */
size_t qk_coroutine_stack_size(void);
void qk_coroutine_pool_drain(void);

#endif
