/*
 * Interpreter commands for deterministic race tests: break EVENT TAG,
 * remove_break TAG, wait_break TAG, resume TAG (qemu-io's names). They
 * drive the debug breakpoints of src/block/debug.h; a request paused at a
 * breakpoint stays in flight until resumed, so aio_ commands started
 * around it show the order the driver lets requests finish in.
 */
#include "io/io.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int coroutine_fn break_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    (void)argc;
    int ev = qk_debug_event_parse(argv[1]);
    if (ev < 0) {
        printf("Could not set breakpoint: %s\n", strerror(ENOENT));
        return -ENOENT;
    }
    int r = qk_debug_break(ev, argv[2]);
    if (r < 0) {
        printf("Could not set breakpoint: %s\n", strerror(-r));
    }
    return r;
}

static int coroutine_fn remove_break_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    (void)argc;
    int r = qk_debug_remove_break(argv[1]);
    if (r < 0) {
        printf("Could not remove breakpoint %s: %s\n", argv[1], strerror(-r));
    }
    return r;
}

static int coroutine_fn resume_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    (void)argc;
    int r = qk_debug_resume(argv[1]);
    if (r < 0) {
        printf("Could not resume request: %s\n", strerror(-r));
    }
    return r;
}

static int coroutine_fn wait_break_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    (void)argc;
    qk_debug_wait_break(argv[1]);
    return 0;
}

const QkIoCmd qk_io_debug_cmds[] = {
    {"break", NULL, 2, 2, "event tag", "sets a breakpoint on event and tags the stopped request as tag",
     break_f},
    {"remove_break", NULL, 1, 1, "tag", "remove a breakpoint by tag", remove_break_f},
    {"resume", NULL, 1, 1, "tag", "resumes the request tagged as tag", resume_f},
    {"wait_break", NULL, 1, 1, "tag", "waits for the suspension of a request", wait_break_f},
    {NULL, NULL, 0, 0, NULL, NULL, NULL},
};
