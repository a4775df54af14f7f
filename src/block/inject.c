/*
 * The fault injection rule set (see inject.h): parsing a rule list,
 * counting writes per kind and flushes, and deciding which fail. State is
 * per process: tests drive one command, or one daemon, at a time.
 */
#include "block/inject.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_RULES 16

typedef enum Mode { MODE_ONCE, MODE_STICKY, MODE_DEAD } Mode;

typedef struct Rule {
    int op;
    uint64_t nth;
    int err;             /* positive errno */
    Mode mode;
} Rule;

static const char *const op_names[QK_INJ__OPS] = {
    [QK_IO_DATA] = "data",
    [QK_IO_HEADER] = "header",
    [QK_IO_L1] = "l1",
    [QK_IO_L2] = "l2",
    [QK_IO_REFTABLE] = "reftable",
    [QK_IO_REFBLOCK] = "refblock",
    [QK_IO_SNAPSHOT] = "snapshot",
    [QK_INJ_WRITE] = "write",
    [QK_INJ_FLUSH] = "flush",
};

static const struct {
    const char *name;
    int err;
} errnos[] = {
    {"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}, {"EPERM", EPERM},
};

int qk_inject_on;
static Rule rules[MAX_RULES];
static int nrules;
static uint64_t seen[QK_INJ__OPS];
static uint64_t injected;
static int dead_err;     /* a "dead" rule fired: everything fails with this */

const char *qk_inject_op_name(int op)
{
    return op >= 0 && op < QK_INJ__OPS ? op_names[op] : "?";
}

uint64_t qk_inject_seen(int op)
{
    return op >= 0 && op < QK_INJ__OPS ? seen[op] : 0;
}

uint64_t qk_inject_injected(void)
{
    return injected;
}

static int parse_errno(const char *v, int *out)
{
    for (size_t i = 0; i < sizeof(errnos) / sizeof(errnos[0]); i++) {
        if (strcasecmp(v, errnos[i].name) == 0) {
            *out = errnos[i].err;
            return 0;
        }
    }
    char *end;
    long n = strtol(v, &end, 10);
    if (*v && !*end && n > 0 && n < 4096) {
        *out = (int)n;
        return 0;
    }
    return -1;
}

static int parse_rule(char *text, Rule *r, QkError *err)
{
    char *save = NULL;
    char *op = strtok_r(text, ":", &save);
    *r = (Rule){.op = -1, .nth = 1, .err = EIO, .mode = MODE_ONCE};
    for (int i = 0; op && i < QK_INJ__OPS; i++) {
        if (strcmp(op, op_names[i]) == 0) {
            r->op = i;
        }
    }
    if (r->op < 0) {
        return qk_error_set(err, -EINVAL, "fault injection: unknown operation '%s' (write, data, header, "
                            "l1, l2, reftable, refblock, snapshot or flush)", op ? op : "");
    }
    for (char *kv = strtok_r(NULL, ":", &save); kv; kv = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            return qk_error_set(err, -EINVAL, "fault injection: '%s' is not KEY=VALUE", kv);
        }
        *eq = 0;
        const char *v = eq + 1;
        char *end;
        if (strcmp(kv, "nth") == 0) {
            unsigned long long n = strtoull(v, &end, 10);
            if (!*v || *end || n == 0) {
                return qk_error_set(err, -EINVAL, "fault injection: nth must be a number from 1 ('%s')", v);
            }
            r->nth = n;
        } else if (strcmp(kv, "errno") == 0) {
            if (parse_errno(v, &r->err) < 0) {
                return qk_error_set(err, -EINVAL, "fault injection: unknown errno '%s'", v);
            }
        } else if (strcmp(kv, "mode") == 0) {
            if (strcmp(v, "once") == 0) {
                r->mode = MODE_ONCE;
            } else if (strcmp(v, "sticky") == 0) {
                r->mode = MODE_STICKY;
            } else if (strcmp(v, "dead") == 0) {
                r->mode = MODE_DEAD;
            } else {
                return qk_error_set(err, -EINVAL, "fault injection: mode must be once, sticky or dead");
            }
        } else {
            return qk_error_set(err, -EINVAL, "fault injection: unknown key '%s' (nth, errno, mode)", kv);
        }
    }
    return 0;
}

int qk_inject_configure(const char *spec, QkError *err)
{
    nrules = 0;
    qk_inject_on = 0;
    dead_err = 0;
    injected = 0;
    memset(seen, 0, sizeof(seen));
    if (!spec || !*spec) {
        return 0;
    }
    char *copy = strdup(spec);
    if (!copy) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    char *save = NULL;
    int r = 0;
    for (char *t = strtok_r(copy, ",", &save); t && r == 0; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "count") == 0) {
            continue;
        }
        if (nrules == MAX_RULES) {
            r = qk_error_set(err, -EINVAL, "fault injection: more than %d rules", MAX_RULES);
            break;
        }
        /* strtok_r state of the outer loop lives in save, so nesting is fine. */
        r = parse_rule(t, &rules[nrules], err);
        if (r == 0) {
            nrules++;
        }
    }
    free(copy);
    if (r < 0) {
        nrules = 0;
        return r;
    }
    qk_inject_on = 1;
    return 0;
}

/* Counts one operation of each op in ops and returns the error to fail
 * it with, or 0. */
static int decide(const int *ops, int nops)
{
    for (int i = 0; i < nops; i++) {
        seen[ops[i]]++;
    }
    int e = dead_err;
    for (int k = 0; k < nrules && !e; k++) {
        const Rule *r = &rules[k];
        for (int i = 0; i < nops; i++) {
            if (r->op != ops[i] || seen[r->op] < r->nth) {
                continue;
            }
            if (r->mode == MODE_ONCE && seen[r->op] != r->nth) {
                continue;
            }
            e = r->err;
            if (r->mode == MODE_DEAD) {
                dead_err = e;
            }
            break;
        }
    }
    if (e) {
        injected++;
    }
    return -e;
}

int qk_inject_write_slow(int flags)
{
    int kind = (flags & QK_REQ_KIND_MASK) >> QK_REQ_KIND_SHIFT;
    int ops[2] = {QK_INJ_WRITE, kind < QK_IO__KINDS ? kind : QK_IO_DATA};
    return decide(ops, 2);
}

int qk_inject_flush_slow(void)
{
    int ops[1] = {QK_INJ_FLUSH};
    return decide(ops, 1);
}

void qk_inject_stats(char *buf, size_t len)
{
    size_t n = 0;
    for (int k = -1; k <= QK_IO__KINDS && n < len; k++) {
        int w;
        if (k < 0) {
            w = snprintf(buf, len, "write %" PRIu64 " (", seen[QK_INJ_WRITE]);
        } else if (k < QK_IO__KINDS) {
            w = snprintf(buf + n, len - n, "%s%s %" PRIu64, k ? ", " : "", op_names[k], seen[k]);
        } else {
            w = snprintf(buf + n, len - n, "), flush %" PRIu64 "; %" PRIu64 " fault(s) injected",
                         seen[QK_INJ_FLUSH], injected);
        }
        if (w < 0) {
            break;
        }
        n += (size_t)w;
    }
}
