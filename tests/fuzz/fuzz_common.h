/*
 * Shared by the libFuzzer targets in tests/fuzz: images held in memfds
 * (so a fuzz run never touches the disk), a private scratch directory for
 * the targets that must create files, and a base qcow2 image built once
 * per process for the targets that serve one.
 *
 * Owns: harness plumbing only. Every check of behaviour is the library's
 * own (sanitizers, assertions); these helpers never judge results.
 */
#ifndef QK_FUZZ_COMMON_H
#define QK_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Largest input any target looks at: images beyond this are cut. */
#define FUZZ_MAX_INPUT (4u << 20)

/* Once per process: ignores SIGPIPE/SIGXFSZ and caps file sizes, so a
 * hostile image that makes repair grow a file fails with EFBIG instead of
 * filling memory. */
void fuzz_init(void);

/* Prints a line to stderr when FUZZ_DEBUG is set (to see why an input
 * goes nowhere, e.g. an image the open refuses). */
void fuzz_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A memfd holding len bytes of data; -1 on failure. *path gets the name
 * the library opens it by ("/proc/self/fd/N"). */
int fuzz_memfd(const uint8_t *data, size_t len, char *path, size_t pathlen);

/* A fresh private directory, made the working directory; NULL on failure. */
const char *fuzz_scratch_dir(void);
/* Removes every file in the scratch directory (not the directory). */
void fuzz_scratch_clean(void);

/* A small qcow2 image (1 MiB virtual, 64 KiB clusters, some clusters
 * written, a snapshot none) built once with the library; the bytes stay
 * valid for the process. NULL on failure. */
const uint8_t *fuzz_base_image(size_t *len);

#endif
