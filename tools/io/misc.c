/*
 * Interpreter commands that touch no image data: help, sleep, quit.
 */
#include "io/io.h"

#include <errno.h>
#include <stdio.h>

static void print_one(const QkIoCmd *c)
{
    qk_io_usage(c);
}

static int coroutine_fn help_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    if (argc == 1) {
        qk_io_for_each(print_one);
        printf("\nUse 'help commandname' for extended help.\n");
        return 0;
    }
    const QkIoCmd *c = qk_io_find(argv[1]);
    if (!c) {
        printf("command %s not found\n", argv[1]);
        return -EINVAL;
    }
    qk_io_usage(c);
    return 0;
}

static int coroutine_fn sleep_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    (void)argc;
    int64_t ms = qk_io_cvtnum(argv[1]);
    if (ms < 0) {
        return -EINVAL;
    }
    qk_co_sleep_ns(ms * 1000000);
    return 0;
}

static int coroutine_fn quit_f(QkIo *io, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    io->quit = true;
    return 0;
}

const QkIoCmd qk_io_misc_cmds[] = {
    {"help", "?", 0, 1, "[command]", "help for one or all commands", help_f},
    {"sleep", NULL, 1, 1, "milliseconds", "waits for the given value in milliseconds", sleep_f},
    {"quit", "q", 0, 0, "", "exit the program", quit_f},
    {NULL, NULL, 0, 0, NULL, NULL, NULL},
};
