/*
 * The `io` command interpreter (qemu-io compatible): shared state, the
 * command descriptor, and the output helpers every command family uses.
 *
 * A command family is one file with a table of QkIoCmd; dispatch.c lists
 * the families. Commands run inside the interpreter's coroutine, so they
 * call qk_co_* directly; aio_* commands start their own coroutines.
 */
#ifndef QK_TOOLS_IO_IO_H
#define QK_TOOLS_IO_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qcowkit/engine.h"


typedef struct QkIo {
    QkBlock *bs;
    unsigned aio_in_flight;
    QkCoQueue aio_idle;        /* woken when aio_in_flight drops to 0 */
    bool quit;
} QkIo;

typedef struct QkIoCmd {
    const char *name;
    const char *altname;       /* NULL when none */
    int argmin;                /* arguments after the name, options included */
    int argmax;                /* -1: no limit */
    const char *args;          /* synopsis shown by help and on misuse */
    const char *oneline;
    /* Returns 0 or -errno; a failure makes `io` exit 1 at the end. */
    int coroutine_fn (*fn)(QkIo *io, int argc, char **argv);
} QkIoCmd;

/* Families (one file each). Each table ends with a zeroed entry. */
extern const QkIoCmd qk_io_rw_cmds[];
extern const QkIoCmd qk_io_status_cmds[];
extern const QkIoCmd qk_io_misc_cmds[];
extern const QkIoCmd qk_io_debug_cmds[];   /* debug.c: break, wait_break, resume */
extern const QkIoCmd qk_io_mark_cmds[];    /* mark.c: mark (crash tests) */

/* rw.c: waits for every aio_ request; -EIO if any of them failed. */
int coroutine_fn qk_io_aio_drain(QkIo *io);

/* dispatch.c: runs one command line; returns 0 or -errno. */
int coroutine_fn qk_io_run_line(QkIo *io, const char *line);
const QkIoCmd *qk_io_find(const char *name);
/* Prints "NAME ARGS -- ONELINE", qemu-io's answer to misuse. */
void qk_io_usage(const QkIoCmd *c);
/* Resets getopt for a command's own option parsing. */
void qk_io_getopt_reset(void);
/* Calls fn for every command (help). */
void qk_io_for_each(void (*fn)(const QkIoCmd *c));

/* report.c: qemu-io's number and report formats. */
/* "4 KiB", "1.500 KiB", "1000 bytes" */
void qk_io_cvtstr(double v, char *buf, size_t len);
/* Parses a size argument; prints qemu-io's "Parsing error" and returns
 * -errno when it is not one. */
int64_t qk_io_cvtnum(const char *s);
/* Parses a pattern byte; prints the error and returns -1 when invalid. */
int qk_io_parse_pattern(const char *s);
/* "wrote 2048/2048 bytes at offset 30720" and the statistics line. */
void qk_io_report(const char *op, int64_t t0_ns, int64_t t1_ns, int64_t offset,
                  int64_t count, int64_t total, int ops);
/* The -v hex dump. */
void qk_io_dump(const uint8_t *buf, int64_t offset, int64_t len);
/* Largest read/write qemu-io accepts. */
#define QK_IO_MAX_BYTES 2147483136LL

#endif
