/*
 * Rate limits for the copy jobs that have no job object of their own
 * (commit, convert): wait on the limiter's clock, then charge. The
 * arithmetic is util/ratelimit.c's; this adds the sleeping.
 */
#ifndef QK_JOBS_THROTTLE_H
#define QK_JOBS_THROTTLE_H

#include "aio/coroutine.h"
#include "util/ratelimit.h"

/* Waits until rl allows more bytes (at once when its rate is 0), then
 * charges bytes. Every coroutine charging the one rl shares its rate. */
void coroutine_fn qk_co_throttle(QkRateLimit *rl, uint64_t bytes);

#endif
