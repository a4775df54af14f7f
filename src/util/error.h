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

#define QK_ECORRUPT EUCLEAN

typedef struct QkError {
    int code;           /* negative errno, 0 when unset */
    char msg[3072]; /* room for two 1023-byte names, as in qemu-img's bitmap messages */
} QkError;

/* Sets err (if non-NULL and not already set) and returns code (negative errno). */
int qk_error_set(QkError *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Like qk_error_set, appending ": strerror(-code)". */
int qk_error_set_errno(QkError *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Reports image corruption: "image is corrupt: <msg>", code -QK_ECORRUPT. */
int qk_error_corrupt(QkError *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefixes an existing message with "<prefix>: ". */
void qk_error_prefix(QkError *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void qk_error_clear(QkError *err);
static inline int qk_error_is_set(const QkError *err) { return err && err->code; }

#endif
