/*
 * `qcowkit serve`: a long-running process that keeps images open, exports
 * them over NBD and takes commands on a JSON control socket.
 *
 * Owns: startup and shutdown order, signals, the pidfile, export specs.
 * Must not know about NBD wire details or the command line syntax beyond
 * the NAME=VALUE export spec.
 */
#ifndef QK_DAEMON_DAEMON_H
#define QK_DAEMON_DAEMON_H

#include <stdbool.h>
#include <stddef.h>

#include "aio/coroutine.h"
#include "nbd/server.h"
#include "util/error.h"
#include "qcowkit/engine.h"

/* One export: "name=NAME,file=PATH[,format=F][,readonly[=on|off]][,cache=MODE][,description=TEXT]". */
/* QkExportSpec, QkDaemonConfig, qk_export_spec_parse/_clear and
 * qk_daemon_run are declared in qcowkit/engine.h. */
typedef struct QkDaemon QkDaemon;


/* A daemon around an existing NBD server with no sockets, signals or
 * pidfile, for driving control commands through qk_co_control_execute()
 * directly (the control fuzzer). The server stays the caller's; "quit"
 * only sets a flag. Free with qk_daemon_free_detached(). */
QkDaemon *qk_daemon_new_detached(QkNbdServer *srv);
void qk_daemon_free_detached(QkDaemon *d);

/* For control commands. */
QkNbdServer *qk_daemon_nbd_server(QkDaemon *d);
void qk_daemon_request_quit(QkDaemon *d);
/* Opens spec's image and adds it as an export. */
int coroutine_fn qk_co_daemon_add_export(QkDaemon *d, const QkExportSpec *spec, QkError *err);

#endif
