/*
 * Token-bucket rate limiter (see ratelimit.h). The bucket is kept as the
 * virtual time at which everything charged so far is paid for; that makes
 * a rate change take effect at once and needs no periodic refill.
 */
#include "util/ratelimit.h"

void qk_ratelimit_init(QkRateLimit *rl, uint64_t rate, int64_t burst_ns)
{
    rl->rate = rate;
    rl->burst_ns = burst_ns > 0 ? burst_ns : 0;
    rl->next_ns = INT64_MIN / 2;
}

void qk_ratelimit_set_speed(QkRateLimit *rl, uint64_t rate)
{
    rl->rate = rate;
}

int64_t qk_ratelimit_delay(const QkRateLimit *rl, int64_t now_ns)
{
    if (rl->rate == 0 || rl->next_ns <= now_ns) {
        return 0;
    }
    return rl->next_ns - now_ns;
}

void qk_ratelimit_charge(QkRateLimit *rl, uint64_t bytes, int64_t now_ns)
{
    if (rl->rate == 0) {
        return;
    }
    /* Idle time earns at most burst_ns of credit. */
    int64_t start = rl->next_ns;
    if (start < now_ns - rl->burst_ns) {
        start = now_ns - rl->burst_ns;
    }
    unsigned __int128 cost = (unsigned __int128)bytes * 1000000000u / rl->rate;
    if (cost > (unsigned __int128)INT64_MAX / 2) {
        cost = INT64_MAX / 2;
    }
    rl->next_ns = start + (int64_t)cost;
}
