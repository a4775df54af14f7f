/*
 * qcowkit(1) as roff, written by `qcowkit --man` from the same command
 * table and usage texts that --help and `qcowkit help NAME` print, so the
 * manual cannot drift from the program. meson builds and installs it.
 */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

/* The environment variables the tools read besides the library's tuning
 * knobs (qk_tunable_info, listed after these). */
static const struct {
    const char *name, *text;
} env_vars[] = {
    {"QCOWKIT_AIO", "io_uring or threads: the I/O backend of every event loop (as --aio). io_uring is "
                    "the default, with the thread pool as the fallback where io_uring is unavailable."},
    {"QCOWKIT_INJECT", "Testing only: fault injection rules for the host files (see README)."},
    {"QCOWKIT_LOG_WRITES", "Testing only: a file to record every write and flush made to image files."},
    {"QCOWKIT_VMSTATE_FAIL_AT", "Testing only: makes the VM-state writer fail at the given byte."},
};

/* Prints text as roff lines: escapes backslashes and lines that roff
 * would take as requests. */
static void put_text(FILE *f, const char *text)
{
    bool bol = true;
    for (const char *p = text; *p; p++) {
        if (bol && (*p == '.' || *p == '\'')) {
            fputs("\\&", f);
        }
        if (*p == '\\') {
            fputs("\\e", f);
        } else if (*p == '-') {
            fputs("\\-", f);
        } else {
            fputc(*p, f);
        }
        bol = *p == '\n';
    }
    if (!bol) {
        fputc('\n', f);
    }
}

void qk_tool_print_man(FILE *f, const QkCommand *const *cmds, size_t n)
{
    fprintf(f, ".TH QCOWKIT 1 \"\" \"qcowkit %s\" \"User Commands\"\n", QK_VERSION);
    fputs(".SH NAME\nqcowkit \\- create, inspect, check, copy and serve QCOW2 disk images\n", f);
    fputs(".SH SYNOPSIS\n.B qcowkit\n[\\fB\\-\\-aio\\fR io_uring|threads] \\fICOMMAND\\fR [\\fIOPTIONS\\fR...] "
          "\\fIARGS\\fR...\n.br\n.B qcowkit help\n\\fICOMMAND\\fR\n.br\n.B qcowkit \\-\\-version\n", f);
    fputs(".SH DESCRIPTION\nqcowkit reads and writes QCOW2 (v2 and v3) and raw images, byte-compatible "
          "with QEMU: images it writes open unchanged in QEMU, and it opens the images qemu-img writes. "
          "Its commands take the flags, print the text and JSON, and exit with the codes of the "
          "qemu-img and qemu-io commands they match.\n"
          ".PP\nSizes accept the suffixes k, M, G, T (powers of 1024), e.g. 64k or 1G.\n"
          ".PP\nWith \\fB\\-\\-image\\-opts\\fR (info, check, map, measure, resize, bench, snapshot, "
          "amend, commit, rebase, bitmap, compare, convert) the images are QEMU key lists instead of names: "
          "driver=qcow2|raw with file.filename=PATH or file.driver=rbd|nbd and its keys, or "
          "driver=file|rbd|nbd alone (rbd: pool, namespace, image, snapshot, conf, user; nbd: server.type, "
          "server.path, server.host, server.port, export). convert takes "
          "\\fB\\-\\-target\\-image\\-opts\\fR with \\fB\\-n\\fR for its target. Other keys are "
          "refused by name.\n", f);
    fputs(".SH COMMANDS\n", f);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, ".SS %s\n", cmds[i]->name);
        put_text(f, cmds[i]->summary);
        fputs(".PP\n.nf\n", f);
        put_text(f, cmds[i]->usage);
        fputs(".fi\n", f);
    }
    fputs(".SH ENVIRONMENT\n", f);
    for (size_t i = 0; i < sizeof(env_vars) / sizeof(env_vars[0]); i++) {
        fprintf(f, ".TP\n.B %s\n", env_vars[i].name);
        put_text(f, env_vars[i].text);
    }
    for (int t = 0; t < QK_TUNE__COUNT; t++) {
        const QkTunableInfo *ti = qk_tunable_info((QkTunable)t);
        char text[1024];
        snprintf(text, sizeof(text), "%s Programs using the library set it with qk_set_tunable(\"%s\", ...).",
                 ti->doc, ti->name);
        fprintf(f, ".TP\n.B %s\n", ti->env);
        put_text(f, text);
    }
    fputs(".SH EXIT STATUS\n0 on success, 1 on an error (with a message on standard error); "
          "check also returns 2 (corruptions), 3 (leaks only) and 63 (no check for the format), "
          "as qemu-img check does.\n", f);
    fputs(".SH SEE ALSO\n.BR libqcowkit (3),\n.BR qemu-img (1),\n.BR qemu-io (1),\n.BR qemu-nbd (8)\n", f);
}
