/*
 * Error reporting: a negative errno plus a human message.
 * Library code never prints or exits; it fills a QkError and returns -errno.
 * Corruption of an image is reported as -EUCLEAN (QK_ECORRUPT) so callers can
 * tell "the image is broken" from "the I/O failed".
 */
#ifndef QK_UTIL_ERROR_H
#define QK_UTIL_ERROR_H

#include <errno.h>
#include <stdarg.h>

#include "qcowkit/engine.h" /* QkError, qk_error_set */

/* Reports image corruption: "image is corrupt: <msg>", code -QK_ECORRUPT. */
int qk_error_corrupt(QkError *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes an existing message with "<prefix>: ". */
void qk_error_prefix(QkError *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void qk_error_clear(QkError *err);
static inline int qk_error_is_set(const QkError *err) { return err && err->code; }

#endif
