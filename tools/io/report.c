/*
 * Output formats of the io interpreter: human sizes and times the way
 * qemu-io prints them, the per-request statistics line, the hex dump, and
 * parsing of size and pattern arguments with qemu-io's messages.
 */
#include "io/io.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void strip_suffix(char *buf, const char *zeros, const char *unit, size_t len)
{
    size_t n = strlen(buf), z = strlen(zeros);
    if (n >= z && strcmp(buf + n - z, zeros) == 0) {
        buf[n - z] = '\0';
    }
    strncat(buf, unit, len - strlen(buf) - 1);
}

void qk_io_cvtstr(double v, char *buf, size_t len)
{
    static const char *const units[] = {" EiB", " PiB", " TiB", " GiB", " MiB", " KiB"};
    for (int i = 0; i < 6; i++) {
        double scale = (double)(1ULL << (10 * (6 - i)));
        if (v >= scale) {
            snprintf(buf, len, "%.3f", v / scale);
            strip_suffix(buf, ".000", units[i], len);
            return;
        }
    }
    /* Plain bytes keep six decimals (rates below 1 byte/s show them). */
    snprintf(buf, len, "%f", v);
    strip_suffix(buf, ".000000", " bytes", len);
}

/* "00.11 sec" below one second, "h:mm:ss.cc" from then on. */
static void timestr(double secs, char *buf, size_t len)
{
    if (secs < 1.0) {
        snprintf(buf, len, "%05.2f sec", secs);
        return;
    }
    unsigned whole = (unsigned)secs;
    double frac = secs - whole;
    snprintf(buf, len, "%u:%02u:%05.2f", whole / 3600, whole / 60 % 60, (whole % 60) + frac);
}

void qk_io_report(const char *op, int64_t t0_ns, int64_t t1_ns, int64_t offset,
                  int64_t count, int64_t total, int ops)
{
    double secs = (double)(t1_ns - t0_ns) / 1e9;
    if (secs <= 0) {
        secs = 1e-9;
    }
    char s_total[64], s_time[64], s_rate[64];
    printf("%s %" PRId64 "/%" PRId64 " bytes at offset %" PRId64 "\n", op, total, count, offset);
    qk_io_cvtstr((double)total, s_total, sizeof(s_total));
    timestr(secs, s_time, sizeof(s_time));
    qk_io_cvtstr((double)total / secs, s_rate, sizeof(s_rate));
    printf("%s, %d ops; %s (%s/sec and %.4f ops/sec)\n", s_total, ops, s_time, s_rate, ops / secs);
}

void qk_io_dump(const uint8_t *buf, int64_t offset, int64_t len)
{
    for (int64_t i = 0; i < len; i += 16) {
        int64_t n = len - i < 16 ? len - i : 16;
        printf("%08" PRIx64 ": ", (uint64_t)(offset + i));
        for (int64_t j = 0; j < n; j++) {
            printf(" %02x", buf[i + j]);
        }
        printf("  ");
        for (int64_t j = 0; j < n; j++) {
            uint8_t c = buf[i + j];
            /* qemu-io shows letters and digits only; punctuation is '.'. */
            bool alnum = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
            putchar(alnum ? c : '.');
        }
        putchar('\n');
    }
}

int64_t qk_io_cvtnum(const char *s)
{
    uint64_t v;
    int r = qk_parse_size(s, &v);
    if (r == 0 && v > INT64_MAX) {
        r = -ERANGE;
    }
    if (r == -ERANGE) {
        printf("Parsing error: argument too large -- %s\n", s);
        return r;
    }
    if (r < 0) {
        printf("Parsing error: non-numeric argument, or extraneous/unrecognized suffix -- %s\n", s);
        return r;
    }
    return (int64_t)v;
}

int qk_io_parse_pattern(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (errno || end == s || *end || v < 0 || v > 255) {
        printf("%s is not a valid pattern byte\n", s);
        return -1;
    }
    return (int)v;
}
