/*
 * NBD server lifetime: listeners and their accept coroutines, a coroutine
 * per client (handshake, then transmission), the export table, removal of
 * an export while clients use it, and clean shutdown.
 *
 * Owns: who is connected to what and when things may be freed. Must not
 * know about request encoding (transmit.c) or options (handshake.c).
 */
#include "nbd/server_int.h"
#include "nbd/proto.h"
#include "aio/loop.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DEFAULT_MAX_IN_FLIGHT 64
#define DEFAULT_HANDSHAKE_LIMIT_S 10 /* qemu-nbd's default */
#define SHUTDOWN_GRACE_NS (5LL * 1000 * 1000 * 1000)

QkNbdServer *qk_nbd_server_new(const QkNbdServerOptions *opts)
{
    QkNbdServer *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        return NULL;
    }
    srv->max_in_flight = opts && opts->max_in_flight ? opts->max_in_flight : DEFAULT_MAX_IN_FLIGHT;
    int limit = opts && opts->handshake_limit_s ? opts->handshake_limit_s : DEFAULT_HANDSHAKE_LIMIT_S;
    srv->handshake_limit_ns = limit > 0 ? limit * 1000000000LL : 0;
    qk_co_queue_init(&srv->clients_gone);
    qk_co_queue_init(&srv->accept_done);
    return srv;
}

uint16_t qk_nbd_export_flags(const QkNbdExport *exp, bool structured)
{
    /* One process and one cache serve every connection, so a flush on
     * any connection covers writes made on all of them: multi-conn is safe. */
    uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |
                 NBD_FLAG_SEND_CACHE | NBD_FLAG_CAN_MULTI_CONN;
    if (structured) {
        f |= NBD_FLAG_SEND_DF; /* proto.md: only where DF can be honoured */
    }
    if (exp->readonly) {
        f |= NBD_FLAG_READ_ONLY;
    } else {
        f |= NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
    }
    return f;
}

QkNbdExport *qk_nbd_lookup(QkNbdServer *srv, const char *name, size_t len)
{
    if (len == 0) {
        return srv->exports;
    }
    for (QkNbdExport *e = srv->exports; e; e = e->next) {
        if (strlen(e->name) == len && memcmp(e->name, name, len) == 0) {
            return e;
        }
    }
    return NULL;
}

QkNbdExport *qk_nbd_server_find_export(QkNbdServer *srv, const char *name)
{
    for (QkNbdExport *e = srv->exports; e; e = e->next) {
        if (strcmp(e->name, name) == 0) {
            return e;
        }
    }
    return NULL;
}

QkNbdExport *qk_nbd_server_first_export(QkNbdServer *srv)
{
    return srv->exports;
}

unsigned qk_nbd_server_client_count(QkNbdServer *srv)
{
    return srv->nclients;
}

int qk_nbd_server_add_export(QkNbdServer *srv, const char *name, const char *description,
                             QkBlock *bs, bool readonly, const char *cache, QkError *err)
{
    if (!name[0] || strlen(name) > 4096) {
        return qk_error_set(err, -EINVAL, "export name must be 1 to 4096 bytes");
    }
    if (qk_nbd_server_find_export(srv, name)) {
        return qk_error_set(err, -EEXIST, "export '%s' already exists", name);
    }
    QkNbdExport *e = calloc(1, sizeof(*e));
    if (!e || !(e->name = strdup(name)) || !(e->cache = strdup(cache ? cache : "writeback"))) {
        if (e) {
            free(e->name);
        }
        free(e);
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    e->description = description ? strdup(description) : NULL;
    e->bs = bs;
    e->readonly = readonly;
    qk_co_queue_init(&e->clients_gone);
    QkNbdExport **pp = &srv->exports;
    while (*pp) {
        pp = &(*pp)->next;
    }
    *pp = e;
    return 0;
}

static void export_free(QkNbdExport *e)
{
    free(e->name);
    free(e->description);
    free(e->cache);
    free(e);
}

void qk_nbd_export_set_node(QkNbdServer *srv, QkNbdExport *e, QkBlock *bs)
{
    /* Pins on the old node must go before it may be closed: the client
     * would otherwise keep pointers into freed bitmaps. Only clients in
     * transmission hold pins (one still haggling takes them when it
     * starts, on whatever node the export has then). */
    QkBlock *old = e->bs;
    for (QkNbdClient *c = srv->clients; c; c = c->next) {
        if (c->exp == e && c->held) {
            qk_nbd_client_release_bitmaps(c);
            e->bs = bs;
            qk_nbd_client_hold_bitmaps(c);
            e->bs = old;
        }
    }
    e->bs = bs;
}

/* Asks a client to stop after answering what it has in flight. */
static void client_kick(QkNbdClient *c)
{
    c->closing = true;
    /* Ends the reader's wait with EOF; replies can still be written. */
    shutdown(c->fd, SHUT_RD);
    qk_co_queue_wake_all(&c->slot_wait);
}

/* Stops the clients of export e (every client when e is NULL): each
 * answers what it has in flight; one that stopped reading our replies
 * would block its last send forever, so after a grace period its write
 * side is cut too. Returns once they are gone. */
static void coroutine_fn stop_clients(QkNbdServer *srv, QkNbdExport *e)
{
    for (QkNbdClient *c = srv->clients; c; c = c->next) {
        if (!e || c->exp == e) {
            client_kick(c);
        }
    }
    int64_t deadline = qk_clock_ns() + SHUTDOWN_GRACE_NS;
    while ((e ? e->clients : srv->nclients) > 0 && qk_clock_ns() < deadline) {
        qk_co_sleep_ns(10 * 1000 * 1000);
    }
    for (QkNbdClient *c = srv->clients; c; c = c->next) {
        if (!e || c->exp == e) {
            shutdown(c->fd, SHUT_RDWR);
        }
    }
    if (e) {
        while (e->clients > 0) {
            qk_co_queue_wait(&e->clients_gone);
        }
    } else {
        while (srv->nclients > 0) {
            qk_co_queue_wait(&srv->clients_gone);
        }
    }
}

int coroutine_fn qk_co_nbd_server_del_export(QkNbdServer *srv, const char *name, QkError *err)
{
    QkNbdExport **pp = &srv->exports;
    while (*pp && strcmp((*pp)->name, name) != 0) {
        pp = &(*pp)->next;
    }
    QkNbdExport *e = *pp;
    if (!e || e->removing) {
        return qk_error_set(err, -ENOENT, "export '%s' not found", name);
    }
    e->removing = true;
    *pp = e->next;
    stop_clients(srv, e);
    int r = qk_co_block_close(e->bs);
    export_free(e);
    if (r < 0) {
        return qk_error_set_errno(err, r, "export '%s' was removed, but writing back its last changes "
                                  "failed", name);
    }
    return 0;
}

/* ---- clients ---- */

static void coroutine_fn client_entry(void *opaque)
{
    QkNbdClient *c = opaque;
    QkNbdServer *srv = c->srv;
    if (qk_nbd_handshake(c) == 1 && !c->exp->removing) {
        qk_nbd_transmit(c);
    }
    if (c->exp) {
        if (--c->exp->clients == 0) {
            qk_co_queue_wake_all(&c->exp->clients_gone);
        }
    }
    QkNbdClient **pp = &srv->clients;
    while (*pp != c) {
        pp = &(*pp)->next;
    }
    *pp = c->next;
    srv->nclients--;
    close(c->fd);
    free(c->rd);
    for (unsigned i = 0; i < c->nbitmaps; i++) {
        free(c->bitmaps[i]);
    }
    free(c->bitmaps);
    free(c->meta_export);
    free(c);
    qk_co_queue_wake_all(&srv->clients_gone);
}

static void start_client(QkNbdServer *srv, int fd)
{
    QkNbdClient *c = calloc(1, sizeof(*c));
    QkSockReader *rd = malloc(sizeof(*rd));
    if (!c || !rd) {
        free(c);
        free(rd);
        close(fd);
        return;
    }
    c->srv = srv;
    c->fd = fd;
    c->rd = rd;
    qk_sock_reader_init(rd, fd);
    qk_co_queue_init(&c->slot_wait);
    qk_co_queue_init(&c->idle);
    qk_co_mutex_init(&c->send_lock);
    c->next = srv->clients;
    srv->clients = c;
    srv->nclients++;
    qk_coroutine_wake(qk_coroutine_create(client_entry, c));
}

int qk_nbd_server_add_client(QkNbdServer *srv, int fd)
{
    int r = qk_sock_set_nonblock(fd);
    if (r < 0) {
        close(fd);
        return r;
    }
    start_client(srv, fd);
    return 0;
}

/* ---- listeners ---- */

static void coroutine_fn accept_entry(void *opaque)
{
    QkNbdListener *l = opaque;
    QkNbdServer *srv = l->srv;
    while (l->running) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (qk_co_wait_fd(l->fd, POLLIN, -1) < 0) {
                    break; /* cancelled: shutting down */
                }
                continue;
            }
            /* Out of fds or memory: back off rather than spin. */
            qk_co_sleep_ns(100 * 1000 * 1000);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* fails harmlessly on unix sockets */
        start_client(srv, fd);
    }
    srv->accepting--;
    qk_co_queue_wake_all(&srv->accept_done);
}

static int add_listener(QkNbdServer *srv, int fd, const char *unix_path, QkError *err)
{
    QkNbdListener *l = calloc(1, sizeof(*l));
    if (!l) {
        close(fd);
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    l->srv = srv;
    l->fd = fd;
    l->unix_path = unix_path ? strdup(unix_path) : NULL;
    l->running = true;
    l->next = srv->listeners;
    srv->listeners = l;
    srv->accepting++;
    qk_coroutine_wake(qk_coroutine_create(accept_entry, l));
    return 0;
}

int qk_nbd_server_listen_unix(QkNbdServer *srv, const char *path, QkError *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        return qk_error_set(err, -ENAMETOOLONG, "socket path '%s' is too long", path);
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return qk_error_set_errno(err, -errno, "Could not create socket");
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
        int e = -errno;
        close(fd);
        return qk_error_set_errno(err, e, "Could not listen on '%s'", path);
    }
    return add_listener(srv, fd, path, err);
}

int qk_nbd_server_listen_tcp(QkNbdServer *srv, const char *addr, const char *port, QkError *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res;
    int r = getaddrinfo(addr, port, &hints, &res);
    if (r != 0) {
        return qk_error_set(err, -EINVAL, "Could not resolve '%s' port '%s': %s", addr ? addr : "*",
                            port, gai_strerror(r));
    }
    int listened = 0;
    int last = -EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = -errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (ai->ai_family == AF_INET6) {
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        }
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 128) < 0) {
            last = -errno;
            close(fd);
            continue;
        }
        if (add_listener(srv, fd, NULL, err) == 0) {
            listened++;
        }
    }
    freeaddrinfo(res);
    if (!listened) {
        return qk_error_set_errno(err, last, "Could not listen on %s:%s", addr ? addr : "*", port);
    }
    return 0;
}

static void coroutine_fn stop_listeners(QkNbdServer *srv)
{
    QkLoop *loop = qk_loop_get();
    for (QkNbdListener *l = srv->listeners; l; l = l->next) {
        l->running = false;
        qk_loop_cancel_fd_wait(loop, l->fd);
    }
    while (srv->accepting > 0) {
        qk_co_queue_wait(&srv->accept_done);
    }
    while (srv->listeners) {
        QkNbdListener *l = srv->listeners;
        srv->listeners = l->next;
        close(l->fd);
        if (l->unix_path) {
            unlink(l->unix_path);
            free(l->unix_path);
        }
        free(l);
    }
}

int coroutine_fn qk_co_nbd_server_shutdown(QkNbdServer *srv)
{
    int ret = 0;
    srv->shutting_down = true;
    stop_listeners(srv);
    stop_clients(srv, NULL);
    while (srv->exports) {
        QkNbdExport *e = srv->exports;
        srv->exports = e->next;
        int r = qk_co_block_close(e->bs); /* drains and flushes */
        if (r < 0 && ret == 0) {
            ret = r;
        }
        export_free(e);
    }
    return ret;
}

void qk_nbd_server_free(QkNbdServer *srv)
{
    free(srv);
}
