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

/* One export: "name=NAME,file=PATH[,format=F][,readonly[=on|off]][,cache=MODE][,description=TEXT]". */
typedef struct QkExportSpec {
    char *name;
    char *file;
    char *format;         /* NULL: probe (nbd URIs: raw) */
    char *cache;          /* NULL: writeback */
    char *description;
    bool readonly;
    uint64_t cache_size;  /* qcow2 metadata cache bound in bytes; 0: default */
} QkExportSpec;

int qk_export_spec_parse(const char *text, QkExportSpec *out, QkError *err);
void qk_export_spec_clear(QkExportSpec *spec);

typedef struct QkDaemonConfig {
    const QkExportSpec *exports;
    size_t nexports;
    const char *socket_path;   /* NBD on a unix socket */
    const char *bind_addr;     /* NBD on TCP (with port) */
    const char *port;
    const char *control_path;  /* JSON control socket; NULL: none */
    const char *pidfile;       /* written once everything listens */
    unsigned max_in_flight;    /* per NBD client; 0: default */
} QkDaemonConfig;

typedef struct QkDaemon QkDaemon;

/* Runs until SIGTERM/SIGINT or the "quit" command, then shuts down
 * cleanly. From plain code. Returns 0, or -errno with err set when
 * startup failed. */
int qk_daemon_run(const QkDaemonConfig *cfg, QkError *err);

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
