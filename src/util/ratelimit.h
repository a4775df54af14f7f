/*
 * Token-bucket rate limiter on a virtual clock: each dispatch is charged
 * bytes / rate seconds, and a caller is told how long to wait before it
 * may dispatch. A short burst (burst_ns of credit) is allowed after idle
 * time so a limiter does not fall behind its rate on every small stall.
 *
 * Owns: the arithmetic only. It neither sleeps nor reads the clock itself,
 * so it can be tested without time passing.
 */
#ifndef QK_UTIL_RATELIMIT_H
#define QK_UTIL_RATELIMIT_H

#include <stdint.h>

typedef struct QkRateLimit {
    uint64_t rate;      /* bytes per second; 0: unlimited */
    int64_t burst_ns;   /* idle credit kept, in time */
    int64_t next_ns;    /* virtual time when the bucket is paid up */
} QkRateLimit;

/* Sets up rl for rate bytes/s (0: no limit) with burst_ns of credit. */
void qk_ratelimit_init(QkRateLimit *rl, uint64_t rate, int64_t burst_ns);
/* Changes the rate; what was already charged stays charged. */
void qk_ratelimit_set_speed(QkRateLimit *rl, uint64_t rate);
/* Nanoseconds the caller must wait, from now_ns, before dispatching
 * anything (0: go now). Does not charge. */
int64_t qk_ratelimit_delay(const QkRateLimit *rl, int64_t now_ns);
/* Charges a dispatch of bytes at now_ns. */
void qk_ratelimit_charge(QkRateLimit *rl, uint64_t bytes, int64_t now_ns);

#endif
