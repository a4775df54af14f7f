/*
 * The tuning knob table and its lookup (see tunables.h).
 */
#include "util/tunables.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const QkTunableInfo table[QK_TUNE__COUNT] = {
    [QK_TUNE_URING_ASYNC_MIN] = {"uring-async-min", "QCOWKIT_URING_ASYNC_MIN", 128 << 10, INT32_MAX,
        "Reads (and O_DIRECT writes) of at least this many bytes go to the kernel's io_uring workers "
        "instead of running inline on the event loop (default 131072; 0: never)."},
    [QK_TUNE_URING_ASYNC_MIN_WRITE] = {"uring-async-min-write", "QCOWKIT_URING_ASYNC_MIN_WRITE", 4096,
        INT32_MAX,
        "Buffered writes of at least this many bytes go to the backend's page-cache writer threads "
        "(default 4096; 0: never)."},
    [QK_TUNE_URING_WRITER] = {"uring-writer", "QCOWKIT_URING_WRITER", 1, 1,
        "0 sends buffered writes to io_uring's workers instead of the writer threads (for measuring)."},
    [QK_TUNE_URING_COOP] = {"uring-coop-taskrun", "QCOWKIT_URING_COOP", 0, 1,
        "1 sets up rings with IORING_SETUP_COOP_TASKRUN (completions run when the loop next enters the "
        "kernel rather than by interrupting it). For measuring qcowkit bench: a loop that sleeps in epoll "
        "(qcowkit serve) may then see completions late."},
    [QK_TUNE_BULK_READ_DIRECT] = {"bulk-read-direct", "QCOWKIT_BULK_READ_DIRECT", 1, 1,
        "0 keeps a mirror's bulk reads of a page-cached file in the page cache instead of reading "
        "them with O_DIRECT (for measuring)."},
    [QK_TUNE_URING_SUBMIT_BATCH] = {"uring-submit-batch", "QCOWKIT_URING_SUBMIT_BATCH", 1, 256,
        "Requests are handed to the kernel every this many, not only when the event loop next "
        "waits (default 1: each as it is queued; 0: only then, but for a sequential run that "
        "reaches uring-seq-max)."},
    [QK_TUNE_URING_SEQ_MAX] = {"uring-seq-max", "QCOWKIT_URING_SEQ_MAX", 256 << 10, INT32_MAX,
        "A sequential run of requests (each continuing the last) goes to the kernel once it holds "
        "this many bytes (default 262144; 0: only at the end of the run or the loop's next wait)."},
    [QK_TUNE_LOOP_REAP_BATCH] = {"loop-reap-batch", "QCOWKIT_LOOP_REAP_BATCH", 8, 4096,
        "While a coroutine waits on a descriptor (a client's socket, the async API's eventfd), the "
        "event loop completes at most this many requests before it looks at its descriptors again "
        "(default 8; 0: all that are ready)."},
};

/* The value set through the API plus one; 0: not set (so a knob added to
 * the table needs no initializer here). Values are at most INT32_MAX. */
static _Atomic int64_t set_value[QK_TUNE__COUNT];

static bool parse(const QkTunableInfo *ti, const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < 0 || v > ti->max) {
        return false;
    }
    *out = v;
    return true;
}

int64_t qk_tunable(QkTunable t)
{
    int64_t v = atomic_load(&set_value[t]);
    if (v) {
        return v - 1;
    }
    const char *env = getenv(table[t].env);
    if (env && *env && parse(&table[t], env, &v)) {
        return v;
    }
    return table[t].def;
}

int qk_tunable_set(const char *name, const char *value)
{
    for (int t = 0; t < QK_TUNE__COUNT; t++) {
        if (name && strcmp(name, table[t].name) == 0) {
            int64_t v;
            if (!value || !parse(&table[t], value, &v)) {
                return -EINVAL;
            }
            atomic_store(&set_value[t], v + 1);
            return 0;
        }
    }
    return -ENOENT;
}

const QkTunableInfo *qk_tunable_info(QkTunable t)
{
    return &table[t];
}
