/*
 * The JSON control socket: one JSON object per line, QMP-like.
 *   -> {"execute": "NAME", "arguments": {...}, "id": ANY}
 *   <- {"return": VALUE, "id": ANY}  or  {"error": {"class": C, "desc": D}, "id": ANY}
 * Commands come from tables, one per area (exports, jobs, ...); each
 * area's file defines its table and control.c lists the tables, so a new
 * area is a new file plus one line there.
 *
 * Owns: the socket, framing, dispatch, argument checking. Must not know
 * what any command does.
 */
#ifndef QK_DAEMON_CONTROL_H
#define QK_DAEMON_CONTROL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "aio/coroutine.h"
#include "daemon/daemon.h"
#include "util/error.h"

/* A handler returns the "return" value (a new reference; json_object()
 * for "nothing") or NULL with err set. args is always an object and holds
 * only names listed in params. Handlers run in a coroutine and may yield. */
typedef json_t *coroutine_fn QkControlHandler(QkDaemon *d, json_t *args, QkError *err);

typedef struct QkControlCommand {
    const char *name;
    QkControlHandler *handler;
    const char *const *params;  /* allowed argument names, NULL-terminated; NULL: none */
} QkControlCommand;

typedef struct QkControlTable {
    const QkControlCommand *cmds;
    size_t ncmds;
} QkControlTable;

/* The tables (one per file). */
extern const QkControlTable qk_control_daemon_table;  /* quit */
extern const QkControlTable qk_control_export_table;  /* query-exports, export-add, export-del */
extern const QkControlTable qk_control_job_table;     /* query-jobs */
extern const QkControlTable qk_control_backup_table;  /* backup-start, backup-export-start */
extern const QkControlTable qk_control_bitmap_table;  /* block-dirty-bitmap-* */

/* Cancels every job and waits for them (before exports close at shutdown). */
/* Requests every unfinished job's cancellation (no wait): the first step
 * of shutting down. */
void qk_control_jobs_cancel_all(void);
void coroutine_fn qk_co_control_jobs_shutdown(void);
/* The id of a job that has not finished and uses export NAME's node (the
 * mirror source, or after the switch the target the export serves), or
 * NULL. Such an export must not be removed or mirrored again: nodes are
 * not reference counted, and the job would use a closed node. */
const char *qk_control_export_job(const char *name);

typedef struct QkControl QkControl;

QkControl *qk_control_listen(QkDaemon *d, const char *path, QkError *err);
/* Stops accepting, ends every connection after its current command. */
void coroutine_fn qk_co_control_stop(QkControl *ctl);
void qk_control_free(QkControl *ctl);

/* Runs one request line; returns the reply object (new reference). */
json_t *coroutine_fn qk_co_control_execute(QkDaemon *d, const char *line, size_t len);

/* Argument helpers for handlers: fetch an optional/required member with
 * type checking. Return 0, or -EINVAL with err set ("Parameter 'x' ..."). */
int qk_control_arg_string(json_t *args, const char *key, bool required, const char **out,
                          QkError *err);
/* Accepts a non-negative JSON integer or a size string ("64k", "1G");
 * leaves *out alone when the member is absent. */
int qk_control_arg_size(json_t *args, const char *key, uint64_t *out, QkError *err);
/* Accepts JSON booleans and the strings on/off/true/false. */
int qk_control_arg_bool(json_t *args, const char *key, bool *out, QkError *err);

#endif
