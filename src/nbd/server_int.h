/*
 * Shared between the NBD server's files (server.c: lifetime, handshake.c:
 * option haggling, transmit.c: requests). Not for use outside src/nbd.
 */
#ifndef QK_NBD_SERVER_INT_H
#define QK_NBD_SERVER_INT_H

#include "nbd/server.h"
#include "nbd/sockio.h"

typedef struct QkNbdClient {
    QkNbdServer *srv;
    int fd;
    QkSockReader *rd;
    QkNbdExport *exp;           /* set when transmission starts */
    bool structured;
    bool base_alloc;            /* base:allocation selected */
    bool alloc_depth;           /* qemu:allocation-depth selected */
    /* qemu:dirty-bitmap:NAME contexts selected, context ids 2, 3, ...
     * (names while haggling: a bitmap may go away before GO). */
    char **bitmaps;
    unsigned nbitmaps;
    /* During transmission, the bitmaps those names found, each kept busy
     * so that nobody clears, removes or replaces one under a client that
     * reads it (NULL: gone before transmission began). */
    struct QkDirtyBitmap **held;
    char *meta_export;          /* the export the contexts were set for */
    bool no_zeroes;
    bool closing;               /* stop reading requests, answer what is in flight */
    bool dead;                  /* the socket failed: replies are dropped */
    unsigned in_flight;
    uint64_t in_flight_bytes;   /* data buffered for requests in flight */
    QkCoQueue slot_wait;        /* the reader waits here for a free request slot */
    QkCoQueue idle;             /* woken when in_flight drops to 0 */
    QkCoMutex send_lock;        /* one reply on the wire at a time */
    struct QkNbdClient *next;
} QkNbdClient;

typedef struct QkNbdListener {
    QkNbdServer *srv;
    int fd;
    char *unix_path;            /* removed at shutdown */
    bool running;
    struct QkNbdListener *next;
} QkNbdListener;

struct QkNbdServer {
    unsigned max_in_flight;
    int64_t handshake_limit_ns; /* 0: none */
    QkNbdExport *exports;       /* in the order added */
    QkNbdClient *clients;
    unsigned nclients;
    QkCoQueue clients_gone;     /* woken whenever a client ends */
    QkNbdListener *listeners;
    unsigned accepting;         /* accept coroutines still running */
    QkCoQueue accept_done;
    bool shutting_down;
};

/* Transmission flags for an export. */
uint16_t qk_nbd_export_flags(const QkNbdExport *exp, bool structured);
/* Finds an export by name; "" names the first export (the default). */
QkNbdExport *qk_nbd_lookup(QkNbdServer *srv, const char *name, size_t len);

/* Option haggling. Returns 1 when the client entered transmission
 * (c->exp set and counted), 0 when it ended the session, -errno on a
 * protocol violation or socket error. */
int coroutine_fn qk_nbd_handshake(QkNbdClient *c);
/* Serves requests until the client disconnects or is told to close, then
 * waits for its requests in flight. */
void coroutine_fn qk_nbd_transmit(QkNbdClient *c);
/* The bitmaps behind a transmitting client's contexts, pinned (busy) on
 * its export's node, and given back; see QkNbdClient.held. */
void qk_nbd_client_hold_bitmaps(QkNbdClient *c);
void qk_nbd_client_release_bitmaps(QkNbdClient *c);

#endif
