/* The NBD server and the nbd client driver against each other in one
 * process and one event loop: a raw image exported on a unix socket,
 * opened again as nbd+unix://. Checks data, zeroes, discard, block
 * status, many requests in flight, a read-only export, and that export
 * removal and shutdown wait for clients. With QK_NBD_TEST_URI set, the
 * client part runs against that URI instead (the interop tests point it
 * at qemu-nbd). */
#include "qktest.h"
#include "aio/loop.h"
#include "block/block.h"
#include "nbd/server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIZE (16u << 20)
#define NPAR 64

static QkBlock *client;
static unsigned outstanding;

typedef struct Par {
    uint64_t off;
    uint8_t pat;
} Par;

static void coroutine_fn par_write(void *opaque)
{
    Par *p = opaque;
    uint8_t buf[4096];
    memset(buf, p->pat, sizeof(buf));
    QK_CHECK_EQ(qk_co_pwrite(client, p->off, sizeof(buf), buf, 0), 0);
    outstanding--;
}

static void coroutine_fn par_read(void *opaque)
{
    Par *p = opaque;
    uint8_t buf[4096];
    QK_CHECK_EQ(qk_co_pread(client, p->off, sizeof(buf), buf, 0), 0);
    QK_CHECK(buf[0] == p->pat && buf[4095] == p->pat);
    outstanding--;
}

static void coroutine_fn client_checks(const char *uri)
{
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR};
    client = qk_co_block_open(uri, &o, &err);
    if (!client) {
        fprintf(stderr, "open %s: %s\n", uri, err.msg);
        QK_CHECK(0);
        return;
    }
    QK_CHECK_EQ(qk_block_length(client), SIZE);
    QK_CHECK(strcmp(client->drv->format_name, "raw") == 0);

    uint8_t *buf = malloc(1 << 20), *back = malloc(1 << 20);
    for (unsigned i = 0; i < 1 << 20; i++) {
        buf[i] = (uint8_t)(i * 7 + 3);
    }
    QK_CHECK_EQ(qk_co_pwrite(client, 1 << 20, 1 << 20, buf, QK_REQ_FUA), 0);
    QK_CHECK_EQ(qk_co_pread(client, 1 << 20, 1 << 20, back, 0), 0);
    QK_CHECK(memcmp(buf, back, 1 << 20) == 0);
    /* Unaligned, odd-sized. */
    QK_CHECK_EQ(qk_co_pwrite(client, 12345, 777, buf, 0), 0);
    QK_CHECK_EQ(qk_co_pread(client, 12345, 777, back, 0), 0);
    QK_CHECK(memcmp(buf, back, 777) == 0);
    /* A read split over two buffers. */
    QkIov q;
    qk_iov_init(&q, 2);
    qk_iov_add(&q, back, 100);
    qk_iov_add(&q, back + 200, 4000);
    QK_CHECK_EQ(qk_co_preadv(client, 1 << 20, 4100, &q, 0, 0), 0);
    QK_CHECK(memcmp(back, buf, 100) == 0 && memcmp(back + 200, buf + 100, 4000) == 0);
    qk_iov_destroy(&q);

    /* Zeroes and block status. */
    QK_CHECK_EQ(qk_co_pwrite_zeroes(client, 1 << 20, 65536, QK_REQ_MAY_UNMAP), 0);
    QK_CHECK_EQ(qk_co_pread(client, 1 << 20, 65536, back, 0), 0);
    QK_CHECK(qk_buf_is_zero(back, 65536));
    uint64_t pnum = 0;
    int st = qk_co_block_status(client, 8u << 20, 1u << 20, &pnum, NULL, NULL);
    QK_CHECK(st >= 0 && (st & QK_BS_ZERO) && !(st & QK_BS_DATA));
    QK_CHECK_EQ(pnum, 1u << 20);
    st = qk_co_block_status(client, (1u << 20) + 65536, 4096, &pnum, NULL, NULL);
    QK_CHECK(st >= 0 && (st & QK_BS_DATA));
    QK_CHECK_EQ(qk_co_pdiscard(client, 4u << 20, 1u << 20), 0);
    QK_CHECK_EQ(qk_co_flush(client), 0);

    /* Out of range. */
    QK_CHECK(qk_co_pread(client, SIZE - 100, 4096, back, 0) < 0);

    /* Many in flight at once. */
    static Par par[NPAR];
    for (unsigned i = 0; i < NPAR; i++) {
        par[i] = (Par){(uint64_t)(10u << 20) + i * 8192, (uint8_t)(i + 1)};
        outstanding++;
        qk_coroutine_wake(qk_coroutine_create(par_write, &par[i]));
    }
    while (outstanding) {
        qk_co_sleep_ns(1000000);
    }
    for (unsigned i = 0; i < NPAR; i++) {
        outstanding++;
        qk_coroutine_wake(qk_coroutine_create(par_read, &par[i]));
    }
    while (outstanding) {
        qk_co_sleep_ns(1000000);
    }
    free(buf);
    free(back);
    qk_co_block_close(client);
    client = NULL;

    /* A name that is not exported. */
    char bad[600];
    snprintf(bad, sizeof(bad), "%s", uri);
    char *slash = strstr(bad, ":///");
    if (slash) {
        memcpy(slash + 4, "zz", 2);
        qk_error_clear(&err);
        QkBlock *b = qk_co_block_open(bad, &o, &err);
        QK_CHECK(b == NULL);
        if (b) {
            qk_co_block_close(b);
        }
    }
}

static char sock[512], img[512], uri[600], ro_uri[600];

static void coroutine_fn loopback(void *opaque)
{
    (void)opaque;
    QkError err = {0};
    QkNbdServer *srv = qk_nbd_server_new(NULL);
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "raw"};
    QkBlock *bs = qk_co_block_open(img, &o, &err);
    QK_CHECK(bs != NULL);
    QK_CHECK_EQ(qk_nbd_server_add_export(srv, "d", NULL, bs, false, NULL, &err), 0);
    o.flags = 0;
    QkBlock *ro = qk_co_block_open(img, &o, &err);
    QK_CHECK_EQ(qk_nbd_server_add_export(srv, "ro", "read-only view", ro, true, NULL, &err), 0);
    QK_CHECK(qk_nbd_server_add_export(srv, "d", NULL, ro, true, NULL, &err) == -EEXIST);
    QK_CHECK_EQ(qk_nbd_server_listen_unix(srv, sock, &err), 0);

    client_checks(uri);

    /* The read-only export refuses a read-write open and refuses writes. */
    QkOpenOptions rw = {.flags = QK_OPEN_RDWR};
    qk_error_clear(&err);
    QK_CHECK(qk_co_block_open(ro_uri, &rw, &err) == NULL);
    QkOpenOptions rdo = {.flags = 0};
    QkBlock *r = qk_co_block_open(ro_uri, &rdo, &err);
    QK_CHECK(r != NULL);
    if (r) {
        uint8_t b[512];
        QK_CHECK_EQ(qk_co_pread(r, 1 << 20, sizeof(b), b, 0), 0);
        /* Removing an export that a client uses disconnects that client. */
        QK_CHECK_EQ(qk_co_nbd_server_del_export(srv, "ro", &err), 0);
        QK_CHECK(qk_co_pread(r, 0, sizeof(b), b, 0) < 0);
        qk_co_block_close(r);
    }
    QK_CHECK(qk_co_nbd_server_del_export(srv, "ro", &err) == -ENOENT);
    qk_co_nbd_server_shutdown(srv);
    QK_CHECK_EQ(qk_nbd_server_client_count(srv), 0);
    qk_nbd_server_free(srv);
    QK_CHECK(access(sock, F_OK) != 0);
}

static void coroutine_fn remote(void *opaque)
{
    client_checks(opaque);
}

int main(void)
{
    const char *ext = getenv("QK_NBD_TEST_URI");
    if (ext) {
        qk_co_run(remote, (void *)ext);
        QK_TEST_DONE();
    }
    const char *dir = getenv("TEST_DIR");
    if (!dir) {
        dir = ".";
    }
    snprintf(sock, sizeof(sock), "%s/nbd.sock", dir);
    snprintf(img, sizeof(img), "%s/loop.raw", dir);
    snprintf(uri, sizeof(uri), "nbd+unix:///d?socket=%s", sock);
    snprintf(ro_uri, sizeof(ro_uri), "nbd+unix:///ro?socket=%s", sock);
    int fd = open(img, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, SIZE) < 0) {
        QK_TEST_SKIP("cannot create the test image");
    }
    close(fd);
    qk_co_run(loopback, NULL);
    unlink(img);
    QK_TEST_DONE();
}
