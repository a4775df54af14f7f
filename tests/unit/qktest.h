/*
 * Minimal unit-test helpers: each test is its own program; exit 0 pass,
 * 1 fail, 77 skip (as liburing's tests). QK_CHECK records a failure with
 * its location and keeps going so one run shows every broken assertion.
 */
#ifndef QK_TESTS_QKTEST_H
#define QK_TESTS_QKTEST_H

#include <stdio.h>
#include <stdlib.h>

static int qk_test_failures;

#define QK_CHECK(cond) do { \
    if (!(cond)) { \
        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
        qk_test_failures++; \
    } \
} while (0)

#define QK_CHECK_EQ(a, b) do { \
    long long qk_a_ = (long long)(a), qk_b_ = (long long)(b); \
    if (qk_a_ != qk_b_) { \
        fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, qk_a_, qk_b_); \
        qk_test_failures++; \
    } \
} while (0)

#define QK_TEST_SKIP(why) do { fprintf(stderr, "skip: %s\n", why); exit(77); } while (0)
#define QK_TEST_DONE() return qk_test_failures ? 1 : 0

#endif
