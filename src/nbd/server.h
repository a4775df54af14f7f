/*
 * The NBD server: listening sockets, the table of exports and the
 * connected clients. Everything runs on the calling thread's event loop:
 * one coroutine accepts, one per client reads requests, one per request
 * does the I/O and sends the reply.
 *
 * Owns: exports (and the block nodes handed to them), clients, listeners.
 * Must not know about the command line or the control socket.
 */
#ifndef QK_NBD_SERVER_H
#define QK_NBD_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "aio/co_sync.h"
#include "block/block.h"
#include "util/error.h"

typedef struct QkNbdServer QkNbdServer;

typedef struct QkNbdExport {
    char *name;
    char *description;          /* NULL when none */
    QkBlock *bs;                /* owned: closed when the export goes */
    bool readonly;
    char *cache;                /* as given ("writeback" by default), for queries */
    unsigned clients;           /* connected clients using this export */
    bool removing;
    QkCoQueue clients_gone;     /* woken when clients drops to 0 */
    struct QkNbdExport *next;
} QkNbdExport;

typedef struct QkNbdServerOptions {
    unsigned max_in_flight;     /* per client; 0: default (64) */
    int handshake_limit_s;      /* a client's whole handshake; 0: default (10), < 0: none */
} QkNbdServerOptions;

QkNbdServer *qk_nbd_server_new(const QkNbdServerOptions *opts);
/* Frees a server after qk_co_nbd_server_shutdown(). */
void qk_nbd_server_free(QkNbdServer *srv);

/* Starts listening. A unix socket path is replaced if it exists (a stale
 * socket from a crash must not stop a restart) and removed at shutdown. */
int qk_nbd_server_listen_unix(QkNbdServer *srv, const char *path, QkError *err);
int qk_nbd_server_listen_tcp(QkNbdServer *srv, const char *addr, const char *port, QkError *err);

/* Adds an export over bs; on success the server owns bs (on error the
 * caller still does). */
int qk_nbd_server_add_export(QkNbdServer *srv, const char *name, const char *description,
                             QkBlock *bs, bool readonly, const char *cache, QkError *err);
QkNbdExport *qk_nbd_server_find_export(QkNbdServer *srv, const char *name);
/* Points export e at another node (a mirror's switch; the caller keeps the
 * old one, which it may close). Clients carry on; the dirty bitmaps their
 * contexts name are pinned on the new node instead (by name; a name the
 * new node lacks fails block status from then on). */
void qk_nbd_export_set_node(QkNbdServer *srv, QkNbdExport *e, QkBlock *bs);
QkNbdExport *qk_nbd_server_first_export(QkNbdServer *srv);
/* Removes an export: new connections no longer see it, its clients are
 * disconnected once their requests in flight are answered, then the image
 * is flushed and closed. Returns -ENOENT for an unknown name. */
int coroutine_fn qk_co_nbd_server_del_export(QkNbdServer *srv, const char *name, QkError *err);

/* Clean shutdown: stop accepting, let every client finish the requests it
 * has in flight, disconnect it, then flush and close every export.
 * Returns the first error of closing an export (its last writes may be
 * lost), or 0. */
int coroutine_fn qk_co_nbd_server_shutdown(QkNbdServer *srv);

unsigned qk_nbd_server_client_count(QkNbdServer *srv);

/* Serves a socket that is already connected (the fuzzer hands over one
 * end of a socketpair; socket activation would do the same). The server
 * owns fd from here, on success and on failure. 0 or -errno. */
int qk_nbd_server_add_client(QkNbdServer *srv, int fd);

#endif
