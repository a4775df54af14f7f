/*
 * The qcowkit command table. Each subcommand lives in tools/cmd_NAME.c and
 * exposes one entry point plus its usage text; main.c dispatches.
 * Commands return the process exit status.
 */
#ifndef QK_TOOLS_CMD_H
#define QK_TOOLS_CMD_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "qcowkit/engine.h"


typedef struct QkCommand {
    const char *name;
    const char *summary;
    const char *usage;     /* full help text for `qcowkit help NAME` */
    int (*run)(int argc, char **argv);
} QkCommand;

extern const QkCommand qk_cmd_create;
extern const QkCommand qk_cmd_info;
extern const QkCommand qk_cmd_io;
extern const QkCommand qk_cmd_bench;
extern const QkCommand qk_cmd_map;
extern const QkCommand qk_cmd_check;
extern const QkCommand qk_cmd_serve;
extern const QkCommand qk_cmd_ctl;
extern const QkCommand qk_cmd_mirror;
extern const QkCommand qk_cmd_snapshot;
extern const QkCommand qk_cmd_resize;
extern const QkCommand qk_cmd_commit;
extern const QkCommand qk_cmd_rebase;
extern const QkCommand qk_cmd_convert;
extern const QkCommand qk_cmd_dd;
extern const QkCommand qk_cmd_amend;
extern const QkCommand qk_cmd_compare;
extern const QkCommand qk_cmd_measure;
extern const QkCommand qk_cmd_bitmap;
extern const QkCommand qk_cmd_backup;

/* Shared helpers for commands (tools/common.c). */
/* Prints "qcowkit: <msg>" to stderr. */
void qk_tool_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Parses a size argument or reports "Invalid <what> specified" and returns -1. */
/* "Invalid WHAT specified. You may use k, M, ... suffixes" as qemu-img says it. */
void qk_tool_size_error(const char *what);
/* qk_parse_size, with qemu-img's warning for a hex number with a
 * multiplier suffix (taken, but deprecated). */
int qk_tool_size(const char *arg, uint64_t *out);
int qk_tool_parse_size(const char *arg, const char *what, uint64_t *out);
/* A number argument in [min, max], as qemu-img's cvtnum takes one: not a
 * size gives the two-line suffix message, too big or out of the range
 * "Invalid WHAT specified. Must be between MIN and MAX."; -1 after it. */
int qk_tool_cvtnum(const char *what, const char *arg, uint64_t min, uint64_t max, uint64_t *out);
/* Reports an unknown option / missing argument in getopt style and returns 1. */
int qk_tool_bad_usage(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A usage error in qemu-img's words (fmt has one %s, for arg), then
 * "Try 'qcowkit --help' ..."; returns exit status 1. */
int qk_tool_usage_error(const char *fmt, const char *arg) __attribute__((format(printf, 1, 0)));
/* An -o boolean (on/yes/true, off/no/false) named name; reports qemu-img's
 * error (after prefix, "" or "FILE: ") and returns -1 on anything else. */
int qk_tool_parse_bool(const char *prefix, const char *name, const char *v, bool *out);
/* -l SNAPSHOT_PARAM (convert, measure): an id or name, or
 * snapshot.id=ID[,snapshot.name=NAME]. Parsing reports qemu-img's errors
 * and returns false; loading makes a read-only image read the snapshot
 * ("Failed to load snapshot: ..." and -1 when it cannot). */
typedef struct QkToolSnapshot {
    char *id, *name;      /* point into buf */
    bool id_or_name;      /* the plain form: try the id, then the name */
    char buf[1024];
} QkToolSnapshot;
bool qk_tool_parse_snapshot(const char *arg, QkToolSnapshot *p);
int qk_tool_load_snapshot(QkBlock *bs, const QkToolSnapshot *p);
/* -o creation options of create and convert (tools/create_opts.c), as
 * given: parse checks the syntax of one list (errors prefixed with prefix,
 * "" or "FILE: "), check their meaning, returning qemu-img's message (in why
 * or a constant) or NULL. compression must start as "zlib", lazy as "off". */
typedef struct QkToolCreateOpts {
    QkCreateOptions o;
    const char *prealloc;      /* NULL when not given */
    const char *compat;        /* NULL when not given */
    const char *compression;
    const char *lazy;
    const char *data_file_raw; /* as given, NULL when not given */
    bool cluster_size_set;
} QkToolCreateOpts;
void qk_tool_create_opts_help(bool qcow2, const char *kind); /* "Supported <kind>options:" */
bool qk_tool_opt_list_valid(const char *list);
/* Whether "help" or "?" is an item of any of the N -o lists (qemu-img
 * then prints the options and does nothing else). */
bool qk_tool_opt_lists_want_help(char *const *lists, int n);
/* The next item of a -o list, cut out in place (",," stands for a comma
 * in a value, as in qemu-img; empty items are skipped), or NULL. */
char *qk_tool_opt_next(char **cursor);
int qk_tool_create_opts_parse(QkToolCreateOpts *a, bool qcow2, char *list, const char *prefix);
const char *qk_tool_create_opts_check(QkToolCreateOpts *a, bool qcow2, char *why, size_t len);
/* convert --bitmaps (tools/convert_bitmaps.c): whether src's persistent
 * bitmaps can go to an image of out_fmt (qemu-img's messages; -1 when
 * not), and the copy into dst once the data is there. */
int qk_tool_bitmaps_can_copy(QkBlock *src, const char *out_fmt, bool skip_broken);
int qk_tool_bitmaps_copy(QkBlock *src, QkBlock *dst, bool skip_broken);
/* Parses --output=human|json; reports and returns -1 on anything else. */
int qk_tool_parse_output(const char *cmd, const char *arg, bool *json);
/* Prints j the way qemu-img prints JSON (4-space indent, key order kept). */
void qk_tool_print_json(json_t *j);
/* Opens an image; on failure err holds the reason. */
QkBlock *qk_tool_open(const char *filename, const char *fmt, int flags, QkError *err);
/* Closes an image a command wrote: a failed close (its last flush) turns
 * exit status 0 into 1 with qemu-img's "Could not write the image"; a
 * success prints `done` ("Image resized.") unless quiet. Returns the exit
 * status. bs may be NULL. */
int qk_tool_close_written(QkBlock *bs, int status, bool quiet, const char *done);
/* Prints qemu-img's "Format specific information:" block (qcow2 only). */
void qk_tool_print_format_specific(const QkImageInfo *info);
/* The "encrypt" object of info's format-specific data, in qemu-img's key order. */
json_t *qk_tool_encrypt_json(const QkEncryptInfo *e);
/* The snapshot table as qemu-img prints it (tools/snapshot_list.c):
 * "Snapshot list:" and the table (nothing when n is 0), or the JSON array. */
void qk_tool_print_snapshots(const QkSnapshotInfo *l, int n);
json_t *qk_tool_snapshots_json(const QkSnapshotInfo *l, int n);
/* Writes qcowkit(1) as roff from the command table (tools/manpage.c). */
void qk_tool_print_man(FILE *f, const QkCommand *const *cmds, size_t n);
/* Whether two paths name the same file (device and inode). */
/* qemu-img's warning when a read-write open guessed the raw format (the
 * first sector is then protected: qk_block_format_probed()). */
void qk_tool_warn_guessed_raw(QkBlock *bs, int flags);
bool qk_tool_same_file(const char *a, const char *b);

/* --image-opts/--target-image-opts (image_opts.c): replaces the key lists
 * among a command's arguments (ARGV[0] is the command) by names and format
 * flags, drops the two options; ARGV may then point to a new array.
 * Returns 0, or -1 after printing an error. qk_tool_image_opts_free()
 * frees what it made, once the command is done. */
int qk_tool_image_opts(int *argc, char ***argv);
void qk_tool_image_opts_free(void);
/* The program name used in messages. */
extern const char *qk_progname;

#endif
