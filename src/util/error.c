/*
 * QkError helpers. A message, once set, is kept: the first failure is the
 * one worth reporting, later ones are usually its consequences.
 */
#include "util/error.h"

#include <stdio.h>
#include <string.h>

static int vset(QkError *err, int code, const char *suffix, const char *fmt, va_list ap)
{
    if (!err || err->code) {
        return code;
    }
    err->code = code ? code : -EIO;
    int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    if (suffix && n >= 0 && (size_t)n < sizeof(err->msg)) {
        snprintf(err->msg + n, sizeof(err->msg) - n, ": %s", suffix);
    }
    return code;
}

int qk_error_set(QkError *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

int qk_error_set_errno(QkError *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(err, code, strerror(code < 0 ? -code : code), fmt, ap);
    va_end(ap);
    return code;
}

int qk_error_corrupt(QkError *err, const char *fmt, ...)
{
    char buf[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    return qk_error_set(err, -QK_ECORRUPT, "image is corrupt: %s", buf);
}

void qk_error_prefix(QkError *err, const char *fmt, ...)
{
    if (!err || !err->code) {
        return;
    }
    char pre[256], old[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof(pre), fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof(old));
    snprintf(err->msg, sizeof(err->msg), "%.200s: %.300s", pre, old);
}

void qk_error_clear(QkError *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}
