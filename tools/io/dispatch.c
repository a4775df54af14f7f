/*
 * The io interpreter's command dispatch: splits a command line into words,
 * finds the command in the families' tables, checks the argument count the
 * way qemu-io does and runs it. Adding a family = adding its table here.
 */
#include "io/io.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const QkIoCmd *const families[] = {
    qk_io_rw_cmds,
    qk_io_status_cmds,
    qk_io_misc_cmds,
    qk_io_debug_cmds,
    qk_io_mark_cmds,
};

#define MAX_WORDS 64

void qk_io_for_each(void (*fn)(const QkIoCmd *c))
{
    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
        for (const QkIoCmd *c = families[f]; c->name; c++) {
            fn(c);
        }
    }
}

const QkIoCmd *qk_io_find(const char *name)
{
    for (size_t f = 0; f < sizeof(families) / sizeof(families[0]); f++) {
        for (const QkIoCmd *c = families[f]; c->name; c++) {
            if (strcmp(c->name, name) == 0 || (c->altname && strcmp(c->altname, name) == 0)) {
                return c;
            }
        }
    }
    return NULL;
}

void qk_io_usage(const QkIoCmd *c)
{
    printf("%s %s -- %s\n", c->name, c->args, c->oneline);
}

void qk_io_getopt_reset(void)
{
    /* 0 (not 1) makes glibc forget state left by an earlier command. */
    optind = 0;
    opterr = 1;
}

static bool argcount_ok(const QkIoCmd *c, int n)
{
    if (n >= c->argmin && (c->argmax < 0 || n <= c->argmax)) {
        return true;
    }
    fflush(stdout);
    if (c->argmax < 0) {
        fprintf(stderr, "bad argument count %d to %s, expected at least %d arguments\n", n, c->name,
                c->argmin);
    } else if (c->argmin == c->argmax) {
        fprintf(stderr, "bad argument count %d to %s, expected %d arguments\n", n, c->name, c->argmin);
    } else {
        fprintf(stderr, "bad argument count %d to %s, expected between %d and %d arguments\n", n,
                c->name, c->argmin, c->argmax);
    }
    return false;
}

int coroutine_fn qk_io_run_line(QkIo *io, const char *line)
{
    char *copy = strdup(line);
    if (!copy) {
        return -ENOMEM;
    }
    char *argv[MAX_WORDS + 1];
    int argc = 0;
    char *save = NULL;
    for (char *w = strtok_r(copy, " \t\n", &save); w && argc < MAX_WORDS; w = strtok_r(NULL, " \t\n", &save)) {
        argv[argc++] = w;
    }
    argv[argc] = NULL;
    int r = 0;
    if (argc > 0) {
        const QkIoCmd *c = qk_io_find(argv[0]);
        if (!c) {
            fflush(stdout);
            fprintf(stderr, "command \"%s\" not found\n", argv[0]);
            r = -EINVAL;
        } else if (!argcount_ok(c, argc - 1)) {
            r = -EINVAL;
        } else {
            qk_io_getopt_reset();
            r = c->fn(io, argc, argv);
        }
    }
    fflush(stdout);
    free(copy);
    return r;
}
