/*
 * Size parsing and formatting for command lines and reports.
 */
#include "util/size.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int suffix_shift(const char *s, unsigned *shift)
{
    static const char units[] = "BKMGTPE";
    if (*s == '\0') {
        *shift = 0;
        return 0;
    }
    const char *p = strchr(units, toupper((unsigned char)*s));
    if (!p) {
        return -EINVAL;
    }
    *shift = (unsigned)(p - units) * 10;
    s++;
    /* Allow "KB", "KiB" after a non-byte unit. */
    if (*shift && (strcmp(s, "B") == 0 || strcmp(s, "iB") == 0 || strcmp(s, "b") == 0)) {
        return 0;
    }
    return *s == '\0' ? 0 : -EINVAL;
}

int qk_parse_uint(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s)) {
        return -EINVAL;
    }
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno == ERANGE) {
        return -ERANGE;
    }
    if (*end != '\0' || end == s) {
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int qk_parse_size(const char *s, uint64_t *out)
{
    while (s && isspace((unsigned char)*s)) {
        s++; /* as qemu-img's sizes: leading blanks are skipped */
    }
    if (!s || !(isdigit((unsigned char)*s) || *s == '.')) {
        return -EINVAL;
    }
    char *end;
    errno = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        /* Hexadecimal bytes, without a fraction; a suffix is taken, as
         * qemu-img 7.2 takes it (deprecated there: the tools warn). */
        unsigned long long hv = strtoull(s, &end, 16);
        if (errno == ERANGE) {
            return -ERANGE;
        }
        unsigned hshift;
        if (end == s + 2 || suffix_shift(end, &hshift) < 0) {
            return -EINVAL;
        }
        if (hshift && hv > (UINT64_MAX >> hshift)) {
            return -ERANGE;
        }
        *out = (uint64_t)hv << hshift;
        return 0;
    }
    unsigned long long ival = strtoull(s, &end, 10);
    if (errno == ERANGE) {
        return -ERANGE;
    }
    double frac = 0;
    if (*end == '.') {
        char *fend;
        frac = strtod(end, &fend);
        if (fend == end + 1 && !isdigit((unsigned char)end[1])) {
            return -EINVAL;
        }
        end = fend;
    }
    unsigned shift;
    if (suffix_shift(end, &shift) < 0) {
        return -EINVAL;
    }
    if (frac != 0 && shift == 0) {
        return -EINVAL; /* fractional bytes make no sense */
    }
    if (shift && ival > (UINT64_MAX >> shift)) {
        return -ERANGE;
    }
    uint64_t v = (uint64_t)ival << shift;
    if (frac != 0) {
        double extra = frac * (double)(1ULL << shift);
        if (v + (uint64_t)extra < v) {
            return -ERANGE;
        }
        v += (uint64_t)llround(extra);
    }
    *out = v;
    return 0;
}

char *qk_format_size(uint64_t v, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int i = 0;
    double d = (double)v;
    while (d >= 1024 && i < 6) {
        d /= 1024;
        i++;
    }
    if (i == 0) {
        snprintf(buf, len, "%llu B", (unsigned long long)v);
    } else {
        /* Three significant digits, trailing zeros dropped, as qemu-img. */
        char tmp[32];
        snprintf(tmp, sizeof(tmp), "%.*f", d >= 100 ? 0 : d >= 10 ? 1 : 2, d);
        char *dot = strchr(tmp, '.');
        if (dot) {
            char *e = tmp + strlen(tmp) - 1;
            while (e > dot && *e == '0') {
                *e-- = '\0';
            }
            if (e == dot) {
                *e = '\0';
            }
        }
        snprintf(buf, len, "%s %s", tmp, units[i]);
    }
    return buf;
}
