/* Token-bucket rate limiter: delays follow the rate, idle time earns at
 * most the burst, a speed change applies at once, 0 means unlimited. */
#include "qktest.h"
#include "util/ratelimit.h"

#define MS 1000000LL

int main(void)
{
    QkRateLimit rl;
    qk_ratelimit_init(&rl, 0, 100 * MS);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, 0), 0);
    qk_ratelimit_charge(&rl, 1ULL << 40, 0);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, 0), 0);

    /* 1 MB/s, 100 ms burst: starting fresh, 100 KB go at once. */
    qk_ratelimit_init(&rl, 1000000, 100 * MS);
    int64_t now = 5000 * MS;
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, now), 0);
    qk_ratelimit_charge(&rl, 100000, now);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, now), 0);
    qk_ratelimit_charge(&rl, 500000, now);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, now), 500 * MS);

    /* Simulated steady sender of 64 KiB pieces over 10 s: the rate holds. */
    uint64_t sent = 0;
    int64_t t = now;
    while (t < now + 10000 * MS) {
        t += qk_ratelimit_delay(&rl, t);
        qk_ratelimit_charge(&rl, 65536, t);
        sent += 65536;
    }
    double rate = (double)sent / 10.0;
    QK_CHECK(rate > 0.95e6 && rate < 1.1e6);

    /* Long idle earns only the burst. */
    t += 60000 * MS;
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, t), 0);
    qk_ratelimit_charge(&rl, 200000, t);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, t), 100 * MS);

    /* Raising the speed shortens the next charge, not the debt. */
    qk_ratelimit_set_speed(&rl, 10000000);
    int64_t d = qk_ratelimit_delay(&rl, t);
    QK_CHECK_EQ(d, 100 * MS);
    qk_ratelimit_charge(&rl, 1000000, t + d);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, t + d), 100 * MS);
    /* Unlimited: never waits. */
    qk_ratelimit_set_speed(&rl, 0);
    QK_CHECK_EQ(qk_ratelimit_delay(&rl, t), 0);
    QK_TEST_DONE();
}
