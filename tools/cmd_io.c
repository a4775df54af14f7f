/*
 * qcowkit io: a qemu-io compatible command interpreter. This file owns the
 * command line (open options, -c commands or stdin) and the exit status;
 * the commands themselves live in tools/io/ (dispatch.c and one file per
 * family).
 */
#include "cmd.h"
#include "io/io.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit io [-f FMT] [-t CACHE] [-i AIO] [-n] [-r] [-U] [--strict-alloc-deps]\n"
    "                  [-c COMMAND]... FILE\n"
    "\n"
    "Runs qemu-io style commands against FILE: each -c in order, or one per\n"
    "line from standard input when there is no -c. Exits 1 if any failed.\n"
    "  -f FMT        image format (default: probe)\n"
    "  -t CACHE      none, writeback (default), writethrough, directsync, unsafe\n"
    "  -n            same as -t none\n"
    "  -i AIO        threads, io_uring or native (native needs -t none)\n"
    "  -r            open read-only\n"
    "  -U            force shared access\n"
    "  --strict-alloc-deps  qcow2: a write waits for every in-flight allocation\n"
    "                of its cluster (reference behaviour for race tests)\n"
    "\n"
    "Commands: read, write, aio_read, aio_write, aio_flush, discard, flush,\n"
    "map, alloc, length, info, sleep, mark, help, quit ('help' lists their options).\n";

typedef struct IoRun {
    QkIo io;
    char **cmds;
    int ncmds;
    int failed;
} IoRun;

static void coroutine_fn interp_entry(void *opaque)
{
    IoRun *run = opaque;
    QkIo *io = &run->io;
    if (run->ncmds > 0) {
        for (int i = 0; i < run->ncmds && !io->quit; i++) {
            if (qk_io_run_line(io, run->cmds[i]) < 0) {
                run->failed = 1;
            }
        }
    } else {
        char *line = NULL;
        size_t cap = 0;
        while (!io->quit && getline(&line, &cap, stdin) > 0) {
            if (qk_io_run_line(io, line) < 0) {
                run->failed = 1;
            }
        }
        free(line);
    }
    /* Requests still in flight complete (and report) before we close. */
    if (qk_io_aio_drain(io) < 0) {
        run->failed = 1;
    }
    fflush(stdout);
}

static int run(int argc, char **argv)
{
    enum { OPT_STRICT = 256 };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"cmd", required_argument, NULL, 'c'},
        {"format", required_argument, NULL, 'f'},
        {"cache", required_argument, NULL, 't'},
        {"aio", required_argument, NULL, 'i'},
        {"nocache", no_argument, NULL, 'n'},
        {"read-only", no_argument, NULL, 'r'},
        {"force-share", no_argument, NULL, 'U'},
        {"strict-alloc-deps", no_argument, NULL, OPT_STRICT},
        {NULL, 0, NULL, 0},
    };
    IoRun r = {0};
    r.cmds = calloc((size_t)argc + 1, sizeof(char *));
    if (!r.cmds) {
        qk_tool_error("out of memory");
        return 1;
    }
    QkOpenOptions o = {.flags = QK_OPEN_RDWR};
    const char *aio = NULL;
    int c, ret = 1;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":c:f:t:i:nrUh", longopts, NULL)) != -1) {
        switch (c) {
        case 'c': r.cmds[r.ncmds++] = optarg; break;
        case 'f': o.format = optarg; break;
        case 't':
            if (qk_cache_mode_parse(optarg, &o.flags) < 0) {
                qk_tool_error("Invalid cache option: %s", optarg);
                goto out;
            }
            break;
        case 'n': o.flags |= QK_OPEN_NOCACHE; break;
        case 'i': aio = optarg; break;
        case 'r': o.flags &= ~QK_OPEN_RDWR; break;
        case 'U': o.flags |= QK_OPEN_FORCE_SHARE; break;
        case OPT_STRICT: o.strict_alloc_deps = true; break;
        case 'h': fputs(usage_text, stdout); ret = 0; goto out;
        case ':': qk_tool_bad_usage("io", "missing argument for option '%s'", argv[optind - 1]); goto out;
        default: qk_tool_bad_usage("io", "unrecognized option '%s'", argv[optind - 1]); goto out;
        }
    }
    if (optind != argc - 1) {
        qk_tool_bad_usage("io", optind >= argc ? "no image file given" : "only one image file may be given");
        goto out;
    }
    const char *filename = argv[optind];
    if (aio) {
        if (strcmp(aio, "native") == 0) {
            if (!(o.flags & QK_OPEN_NOCACHE)) {
                qk_tool_error("can't open device %s: aio=native was specified, but it requires "
                              "cache.direct=on, which was not specified.", filename);
                goto out;
            }
        } else if (qk_set_aio_backend(aio) < 0) {
            qk_tool_error("Invalid aio option: %s", aio);
            goto out;
        }
    }
    QkError err = {0};
    r.io.bs = qk_block_open(filename, &o, &err);
    if (!r.io.bs) {
        qk_tool_error("can't open device %s: %s", filename, err.msg);
        goto out;
    }
    qk_tool_warn_guessed_raw(r.io.bs, o.flags);
    r.io.aio_idle = (QkCoQueue)QK_CO_QUEUE_INIT;
    /* Line buffering keeps reports and stderr messages in order in logs. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    qk_co_run(interp_entry, &r);
    ret = r.failed;
    int cr = qk_block_close(r.io.bs);
    if (cr < 0) {
        qk_tool_error("%s: closing the image failed: %s", filename, strerror(-cr));
        ret = 1;
    }
out:
    free(r.cmds);
    return ret;
}

const QkCommand qk_cmd_io = {
    .name = "io",
    .summary = "run qemu-io style commands on an image",
    .usage = usage_text,
    .run = run,
};
