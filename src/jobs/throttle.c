/*
 * Sleeping side of a rate limit (see throttle.h).
 */
#include "jobs/throttle.h"
#include "aio/loop.h"

void coroutine_fn qk_co_throttle(QkRateLimit *rl, uint64_t bytes)
{
    if (!rl->rate || !bytes) {
        return;
    }
    int64_t d;
    while ((d = qk_ratelimit_delay(rl, qk_clock_ns())) > 0) {
        qk_co_sleep_ns(d);
    }
    qk_ratelimit_charge(rl, bytes, qk_clock_ns());
}
