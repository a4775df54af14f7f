/*
 * qcowkit: entry point. Global options (--help, --version, --man, --aio) and
 * dispatch to subcommands; `qcowkit help NAME` prints a command's usage.
 * QCOWKIT_INJECT arms fault injection (block/inject.h) for the command and
 * reports the counts on stderr at the end.
 */
#include "cmd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const QkCommand *const commands[] = {
    &qk_cmd_create,
    &qk_cmd_info,
    &qk_cmd_measure,
    &qk_cmd_check,
    &qk_cmd_convert,
    &qk_cmd_map,
    &qk_cmd_compare,
    &qk_cmd_resize,
    &qk_cmd_commit,
    &qk_cmd_rebase,
    &qk_cmd_dd,
    &qk_cmd_amend,
    &qk_cmd_bitmap,
    &qk_cmd_backup,
    &qk_cmd_io,
    &qk_cmd_bench,
    &qk_cmd_serve,
    &qk_cmd_ctl,
    &qk_cmd_mirror,
    &qk_cmd_snapshot,
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

static const QkCommand *find(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++) {
        if (strcmp(commands[i]->name, name) == 0) {
            return commands[i];
        }
    }
    return NULL;
}

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: qcowkit [--aio io_uring|threads] COMMAND [OPTIONS...] ARGS...\n"
            "       qcowkit help COMMAND\n"
            "       qcowkit --version\n"
            "       qcowkit --man      (this manual as roff: qcowkit(1))\n"
            "\n"
            "QCOW2 disk-image engine, compatible with qemu-img images.\n"
            "\n"
            "Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++) {
        fprintf(f, "  %-10s %s\n", commands[i]->name, commands[i]->summary);
    }
    fprintf(f, "\nSizes accept suffixes k, M, G, T (powers of 1024), e.g. 64k, 1G.\n"
               "--image-opts (and convert's --target-image-opts) name images by QEMU key lists:\n"
               "  driver=qcow2,file.filename=a.qcow2   driver=rbd,pool=P,image=I[,snapshot=S,conf=F,user=U]\n"
               "  driver=raw,file.driver=nbd,file.server.type=unix,file.server.path=SOCK,file.export=E\n");
}

/* What qemu-img prints when an image turns out corrupt mid-operation,
 * before the operation's own error. */
static void say_corrupt(const QkBlock *bs, bool marked, const char *msg)
{
    (void)bs;
    fflush(stdout);
    if (marked) {
        fprintf(stderr, "qcow2: Marking image as corrupt: %s; further corruption events will be suppressed\n", msg);
    } else {
        fprintf(stderr, "qcow2: Image is corrupt: %s; further non-fatal corruption events will be suppressed\n", msg);
    }
}

int main(int argc, char **argv)
{
    qk_block_set_corrupt_hook(say_corrupt);
    int i = 1;
    bool aio_threads = false;
    while (i < argc && argv[i][0] == '-') {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--man") == 0) {
            qk_tool_print_man(stdout, commands, NCOMMANDS);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0 || strcmp(argv[i], "-V") == 0) {
            printf("qcowkit version %s\n", QK_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--aio") == 0 && i + 1 < argc) {
            aio_threads = strcmp(argv[i + 1], "threads") == 0;
            if (qk_set_aio_backend(argv[i + 1]) < 0) {
                qk_tool_error("Invalid aio backend '%s' (use io_uring or threads)", argv[i + 1]);
                return 1;
            }
            i += 2;
        } else {
            return qk_tool_usage_error("unrecognized option '%s'", argv[i]);
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 1;
    }
    const char *name = argv[i];
    if (strcmp(name, "help") == 0) {
        if (i + 1 >= argc) {
            usage(stdout);
            return 0;
        }
        const QkCommand *c = find(argv[i + 1]);
        if (!c) {
            return qk_tool_usage_error("Command not found: %s", argv[i + 1]);
        }
        fputs(c->usage, stdout);
        return 0;
    }
    const QkCommand *c = find(name);
    if (!c) {
        qk_tool_usage_error("Command not found: %s", name);
        return 1;
    }
    /* The library falls back to the thread pool silently; say so here. */
    const char *want = getenv("QCOWKIT_AIO");
    if (strcmp(qk_loop_backend_name(qk_loop_get()), "io_uring") != 0 && !(want && strcmp(want, "threads") == 0) &&
        !aio_threads) {
        fprintf(stderr, "%s: io_uring unavailable, using the thread pool\n", qk_progname);
    }
    const char *inject = getenv("QCOWKIT_INJECT");
    if (inject && *inject) {
        QkError err = {0};
        if (qk_inject_configure(inject, &err) < 0) {
            qk_tool_error("QCOWKIT_INJECT: %s", err.msg);
            return 1;
        }
    }
    /* getopt in subcommands starts from argv[0] = command name. */
    int cargc = argc - i;
    char **cargv = argv + i;
    if (qk_tool_image_opts(&cargc, &cargv) < 0) {
        return strcmp(name, "compare") == 0 ? 2 : 1; /* compare: 1 means "differ" */
    }
    int r = c->run(cargc, cargv);
    qk_tool_image_opts_free();
    fflush(stdout);
    qk_loop_destroy_current();
    if (inject && *inject) {
        char stats[256];
        qk_inject_stats(stats, sizeof(stats));
        qk_tool_error("inject: %s", stats);
    }
    return r;
}
