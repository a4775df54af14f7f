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
    char file[256];      /* "": every file; else only paths containing it */
    uint64_t seen;       /* ops of this rule's kind on its files */
    bool dead;           /* a "dead" rule fired: its files fail everything */
} Rule;

static const char *const op_names[QK_INJ__OPS] = {
    [QK_IO_DATA] = "data",
    [QK_IO_HEADER] = "header",
    [QK_IO_L1] = "l1",
    [QK_IO_L2] = "l2",
    [QK_IO_REFTABLE] = "reftable",
    [QK_IO_REFBLOCK] = "refblock",
    [QK_IO_SNAPSHOT] = "snapshot",
    [QK_IO_BITMAP] = "bitmap",
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
        } else if (strcmp(kv, "file") == 0) {
            if (!*v || strlen(v) >= sizeof(r->file)) {
                return qk_error_set(err, -EINVAL, "fault injection: file must be 1 to %zu characters",
                                    sizeof(r->file) - 1);
            }
            strcpy(r->file, v);
        } else {
            return qk_error_set(err, -EINVAL, "fault injection: unknown key '%s' (nth, errno, mode, file)",
                                kv);
        }
    }
    return 0;
}

int qk_inject_configure(const char *spec, QkError *err)
{
    nrules = 0;
    qk_inject_on = 0;
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

static bool rule_covers(const Rule *r, const char *file)
{
    return !r->file[0] || (file && strstr(file, r->file));
}

/* Counts one operation of each op in ops, made on file, and returns the
 * error to fail it with, or 0. A rule with a file filter counts only the
 * operations on its files, so "the 20th write to the target" means that. */
static int decide(const char *file, const int *ops, int nops)
{
    for (int i = 0; i < nops; i++) {
        seen[ops[i]]++;
    }
    int e = 0;
    for (int k = 0; k < nrules; k++) {
        Rule *r = &rules[k];
        if (!rule_covers(r, file)) {
            continue;
        }
        if (r->dead) {
            e = e ? e : r->err;
            continue;
        }
        for (int i = 0; i < nops; i++) {
            if (r->op != ops[i]) {
                continue;
            }
            r->seen++;
            if (e || r->seen < r->nth || (r->mode == MODE_ONCE && r->seen != r->nth)) {
                continue;
            }
            e = r->err;
            r->dead = r->mode == MODE_DEAD;
        }
    }
    if (e) {
        injected++;
    }
    return -e;
}

int qk_inject_write_slow(const char *file, int flags)
{
    int kind = (flags & QK_REQ_KIND_MASK) >> QK_REQ_KIND_SHIFT;
    int ops[2] = {QK_INJ_WRITE, kind < QK_IO__KINDS ? kind : QK_IO_DATA};
    return decide(file, ops, 2);
}

int qk_inject_flush_slow(const char *file)
{
    int ops[1] = {QK_INJ_FLUSH};
    return decide(file, ops, 1);
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
