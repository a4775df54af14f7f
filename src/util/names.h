/*
 * Names of enumerations as users spell them (options, JSON arguments):
 * the index of a name in its table.
 */
#ifndef QK_UTIL_NAMES_H
#define QK_UTIL_NAMES_H

#include <errno.h>
#include <stddef.h>
#include <string.h>

/* Index of s in names[0..n), or -EINVAL. */
static inline int qk_name_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            return (int)i;
        }
    }
    return -EINVAL;
}

#endif
