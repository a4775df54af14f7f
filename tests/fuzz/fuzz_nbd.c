/*
 * Fuzz target: the NBD server's handshake and transmission phase. The
 * input is everything a client sends, byte for byte, written into one end
 * of a socketpair whose other end the server serves on the event loop,
 * exactly as it serves an accepted connection. The server's replies are
 * read and dropped. Two exports: "rw" (first, so the default name picks
 * it; a fresh copy of a small qcow2 image per input, so writes do not
 * carry over) and "ro" (read-only).
 */
#include "fuzz_common.h"
#include "aio/co_sync.h"
#include "aio/loop.h"
#include "block/block.h"
#include "nbd/server.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct Run {
    const uint8_t *data;
    size_t size;
    const uint8_t *base;       /* the image both exports start from */
    size_t base_len;
    int peer;                  /* the client's end */
    int running;               /* peer coroutines still going */
    QkCoQueue done;
} Run;

/* The client: sends the input, then half-closes so the server sees EOF. */
static void coroutine_fn send_entry(void *opaque)
{
    Run *r = opaque;
    size_t off = 0;
    while (off < r->size) {
        ssize_t n = send(r->peer, r->data + off, r->size - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            qk_co_wait_fd(r->peer, POLLOUT, -1);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            break; /* the server hung up */
        }
    }
    shutdown(r->peer, SHUT_WR);
    r->running--;
    qk_co_queue_wake_all(&r->done);
}

/* Reads replies until the server closes its end. */
static void coroutine_fn drain_entry(void *opaque)
{
    Run *r = opaque;
    static uint8_t sink[65536];
    for (;;) {
        ssize_t n = recv(r->peer, sink, sizeof(sink), 0);
        if (n > 0 || (n < 0 && errno == EINTR)) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            qk_co_wait_fd(r->peer, POLLIN, -1);
            continue;
        }
        break;
    }
    r->running--;
    qk_co_queue_wake_all(&r->done);
}

static QkBlock *coroutine_fn open_export(const char *path, int flags)
{
    QkError err = {0};
    QkOpenOptions o = {.flags = flags, .format = "qcow2"};
    return qk_co_block_open(path, &o, &err);
}

static void coroutine_fn run_co(void *opaque)
{
    Run *r = opaque;
    const uint8_t *base = r->base;
    size_t blen = r->base_len;
    char rw_path[64], ro_path[64];
    int rw_fd = fuzz_memfd(base, blen, rw_path, sizeof(rw_path));
    int ro_fd = fuzz_memfd(base, blen, ro_path, sizeof(ro_path));
    QkNbdServer *srv = qk_nbd_server_new(NULL);
    QkBlock *rw = NULL, *ro = NULL;
    int sv[2] = {-1, -1};
    QkError err = {0};
    if (rw_fd < 0 || ro_fd < 0 || !srv || !(rw = open_export(rw_path, QK_OPEN_RDWR)) ||
        qk_nbd_server_add_export(srv, "rw", "a writable export", rw, false, NULL, &err) < 0) {
        goto out;
    }
    rw = NULL;
    if (!(ro = open_export(ro_path, 0)) ||
        qk_nbd_server_add_export(srv, "ro", NULL, ro, true, NULL, &err) < 0) {
        goto out;
    }
    ro = NULL;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
        goto out;
    }
    r->peer = sv[1];
    if (qk_nbd_server_add_client(srv, sv[0]) < 0) {
        goto out;
    }
    r->running = 2;
    qk_coroutine_wake(qk_coroutine_create(send_entry, r));
    qk_coroutine_wake(qk_coroutine_create(drain_entry, r));
    while (r->running > 0) {
        qk_co_queue_wait(&r->done);
    }
out:
    if (srv) {
        qk_co_nbd_server_shutdown(srv); /* closes the exports */
        qk_nbd_server_free(srv);
    }
    if (rw) {
        qk_co_block_close(rw);
    }
    if (ro) {
        qk_co_block_close(ro);
    }
    if (sv[1] >= 0) {
        close(sv[1]);
    }
    if (rw_fd >= 0) {
        close(rw_fd);
    }
    if (ro_fd >= 0) {
        close(ro_fd);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_init();
    if (size > FUZZ_MAX_INPUT) {
        return 0;
    }
    Run r = {.data = data, .size = size, .peer = -1};
    /* Built from plain code: creating an image runs the loop itself. */
    r.base = fuzz_base_image(&r.base_len);
    if (!r.base) {
        return 0;
    }
    qk_co_queue_init(&r.done);
    qk_co_run(run_co, &r);
    return 0;
}
