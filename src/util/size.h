/*
 * Human sizes: "64k", "1G", "512" (bytes), "1.5M"; suffixes are powers of
 * 1024 as in qemu-img (k/K, M, G, T, P, E; optional trailing "B"/"iB").
 */
#ifndef QK_UTIL_SIZE_H
#define QK_UTIL_SIZE_H

#include <stddef.h>
#include <stdint.h>

/* Parses s into *out. Returns 0, or -EINVAL (bad syntax) / -ERANGE. */
int qk_parse_size(const char *s, uint64_t *out);
/* Parses a plain non-negative integer (no suffix); 0 or -EINVAL/-ERANGE. */
int qk_parse_uint(const char *s, uint64_t *out);
/* Formats like qemu-img: "64 KiB", "1 GiB", "1.5 MiB", "512 B". */
char *qk_format_size(uint64_t v, char *buf, size_t len);

#endif
