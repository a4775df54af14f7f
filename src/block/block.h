/*
 * The block layer: a graph of nodes (a format node over a protocol "file"
 * child, optionally with a backing node) and the request entry points every
 * caller uses. Entry points check ranges, count requests in flight (so
 * drain and close can wait for them) and then call the node's driver.
 *
 * Owns: node lifetime, driver registry, request entry, in-flight tracking.
 * Must not know any format's internals.
 */
#ifndef QK_BLOCK_BLOCK_H
#define QK_BLOCK_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "aio/co_sync.h"
#include "aio/coroutine.h"
#include "util/error.h"
#include "util/iov.h"
#include "qcowkit/engine.h" /* the types and calls programs use */

typedef struct QkBlockDriver QkBlockDriver;

/* The first bytes a format is guessed from. */
#define QK_PROBE_SIZE 512
/* Would a file starting with these QK_PROBE_SIZE bytes be taken for
 * another format than raw? */
bool qk_block_probes_not_raw(const uint8_t *buf);
/* The name of a format qcowkit does not read that these first bytes
 * announce ("VMDK"), or NULL (foreign.c). */
const char *qk_block_foreign_format(const uint8_t *buf, size_t len);

struct QkBlockDriver {
    const char *format_name;
    size_t instance_size;
    bool is_protocol;            /* opens a host resource by name */
    /* Returns a score (0 no, 100 certain) for the first bytes of a file. */
    int (*probe)(const uint8_t *buf, size_t len);

    int coroutine_fn (*co_open)(QkBlock *bs, const QkOpenOptions *opts, QkError *err);
    /* Releases the node; returns the first error of writing back what it
     * still held (0 for read-only nodes). The node is gone either way. */
    int coroutine_fn (*co_close)(QkBlock *bs);
    int coroutine_fn (*co_create)(const char *filename, const QkCreateOptions *opts, QkError *err);

    int coroutine_fn (*co_preadv)(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                  size_t qiov_off, int flags);
    int coroutine_fn (*co_pwritev)(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                   size_t qiov_off, int flags);
    /* QK_REQ_COMPRESSED writes; NULL: the format cannot compress. */
    int coroutine_fn (*co_pwritev_compressed)(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                              size_t qiov_off);
    int coroutine_fn (*co_pwrite_zeroes)(QkBlock *bs, uint64_t off, uint64_t bytes, int flags);
    int coroutine_fn (*co_pdiscard)(QkBlock *bs, uint64_t off, uint64_t bytes);
    int coroutine_fn (*co_flush)(QkBlock *bs);      /* driver's own metadata; children are flushed by the layer */
    /* Status of [off, off+bytes): returns QK_BS_* flags for the first *pnum bytes (>0). */
    int coroutine_fn (*co_block_status)(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                        uint64_t *map, QkBlock **file);
    int coroutine_fn (*co_truncate)(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err);
    int64_t (*get_length)(QkBlock *bs);
    int64_t (*get_allocated_size)(QkBlock *bs);
    void (*get_info)(QkBlock *bs, QkImageInfo *info);
    /* VM state: stream bytes at pos of the state saved with a snapshot
     * (see block/vmstate.h for the buffered writer and reader). */
    int coroutine_fn (*co_save_vmstate)(QkBlock *bs, QkIov *qiov, uint64_t pos);
    int coroutine_fn (*co_load_vmstate)(QkBlock *bs, QkIov *qiov, uint64_t pos);
    /* Internal snapshots, all or none (NULL: the format has none); called
     * through block/snapshot.h, which documents each. */
    int coroutine_fn (*co_snapshot_list)(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err);
    int coroutine_fn (*co_snapshot_create)(QkBlock *bs, const QkSnapshotInfo *info, QkError *err);
    int coroutine_fn (*co_snapshot_goto)(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                         QkError *err);
    int coroutine_fn (*co_snapshot_delete)(QkBlock *bs, const char *id, const char *name, QkError *err);
    int coroutine_fn (*co_snapshot_load_tmp)(QkBlock *bs, const char *id, const char *name, QkError *err);
    int coroutine_fn (*co_vmstate_discard)(QkBlock *bs, QkError *err);
    /* Drops everything this layer holds, so the backing file shows
     * through everywhere (after commit); NULL: the format cannot. */
    int coroutine_fn (*co_make_empty)(QkBlock *bs);
    /* Records another backing file (name NULL: none) and its format in
     * the image, durably; the open chain stays as it was. */
    int coroutine_fn (*co_change_backing)(QkBlock *bs, const char *name, const char *fmt, QkError *err);
    /* Changes the image's options (amend); NULL: the format has none. */
    int coroutine_fn (*co_amend)(QkBlock *bs, const QkAmendOptions *o, QkError *err);
    /* Whether a new persistent bitmap can be stored (NULL: never); the
     * message says why not. */
    int (*bitmap_can_store)(QkBlock *bs, const char *name, uint64_t granularity, QkError *err);
    /* Before a persistent bitmap stops matching its stored copy (NULL:
     * nothing stored to protect). */
    int coroutine_fn (*co_bitmap_begin_change)(QkBlock *bs, struct QkDirtyBitmap *bm, QkError *err);
    /* Takes a persistent bitmap's stored copy out of the image now (NULL:
     * nothing stored); the node's bitmap is then dropped by the caller. */
    int coroutine_fn (*co_bitmap_remove)(QkBlock *bs, struct QkDirtyBitmap *bm, QkError *err);
};

struct QkBlock {
    const QkBlockDriver *drv;
    void *opaque;                 /* driver state, instance_size bytes */
    char *filename;
    int open_flags;
    bool read_only;
    bool format_probed;           /* the format was guessed from the first bytes */
    bool no_guest_data;           /* QK_OPEN_METADATA_ONLY left the data out */
    /* What the disk holds is unknown after a failed write or flush of a
     * header switch: every later write, flush or truncate fails with EIO,
     * so that whichever metadata the disk names stays intact. */
    bool fenced;
    uint64_t size;                /* virtual size for format nodes */
    QkBlock *file;                /* protocol child; NULL for protocol nodes */
    QkBlock *backing;             /* NULL when none */
    char *backing_file;           /* as recorded in the image */
    char *backing_format;
    uint32_t request_alignment;   /* smallest unit the node serves without RMW */
    uint32_t mem_alignment;       /* buffer alignment for direct I/O */
    unsigned in_flight;
    QkCoQueue drain_waiters;
    QkCoMutex flush_lock;
    struct QkDirtyBitmap *dirty_bitmaps; /* marked by every completed modification */
    struct QkWriteHook *write_hooks;
    unsigned quiesce_counter;     /* > 0: new modifications wait */
    QkCoQueue quiesce_waiters;
};

/* The alignment of a buffer for I/O on bs: its own need, and at least a
 * page, so a buffer spans no more pages than its length needs (a 4 KiB
 * buffer on a 512-byte boundary reaches the device as two segments). */
static inline size_t qk_block_buf_align(const QkBlock *bs)
{
    return bs->mem_alignment > 4096u ? bs->mem_alignment : 4096u;
}

/* Kinds of modification seen by write hooks. */
typedef enum QkWriteKind {
    QK_WRITE_DATA,
    QK_WRITE_ZEROES,
    QK_WRITE_DISCARD,
} QkWriteKind;

/* A hook runs after every successful modification of a node and before
 * the request completes; an error it returns fails the request. Used by
 * write-blocking mirror to copy each new write to the target. qiov is NULL
 * for zeroes and discard. after_write may be NULL. */
typedef struct QkWriteHook {
    int coroutine_fn (*after_write)(struct QkWriteHook *h, QkBlock *bs, QkWriteKind kind,
                                    uint64_t off, uint64_t bytes, QkIov *qiov, size_t qiov_off,
                                    int flags);
    /* Optional: runs when the request enters (after any quiesce wait) in the
     * request's coroutine, so a hook can see which writes overlap in flight.
     * write_failed (optional) replaces after_write when the request fails. */
    void (*before_write)(struct QkWriteHook *h, QkBlock *bs, QkWriteKind kind,
                         uint64_t off, uint64_t bytes);
    void (*write_failed)(struct QkWriteHook *h, QkBlock *bs, QkWriteKind kind,
                         uint64_t off, uint64_t bytes);
    /* Optional: runs when the request enters, before before_write, and may
     * yield: the range still holds its old contents until it returns (a
     * backup job copies them aside). The request counts as in flight, so
     * a quiesce waits for it. */
    void coroutine_fn (*copy_before_write)(struct QkWriteHook *h, QkBlock *bs, QkWriteKind kind,
                                           uint64_t off, uint64_t bytes);
    void *opaque;
    struct QkWriteHook *next;
} QkWriteHook;

/* A node of a driver that is not opened by name (a view another part of
 * the engine provides): no file, no backing; its driver state (zeroed,
 * instance_size bytes) is for the caller to fill. Closed as any node. */
QkBlock *qk_block_new_node(const QkBlockDriver *drv, const char *name, bool read_only);

void qk_block_add_write_hook(QkBlock *bs, QkWriteHook *h);
void qk_block_remove_write_hook(QkBlock *bs, QkWriteHook *h);
/* Holds new writes, zero writes and discards at the entry point (reads go
 * on), then waits for the ones in flight. Nests; end releases. */
void coroutine_fn qk_co_block_quiesce_begin(QkBlock *bs);
void qk_block_quiesce_end(QkBlock *bs);

/* Driver registry (programs ask qk_format_known and friends). */
const QkBlockDriver *qk_block_find_driver(const char *format);
extern const QkBlockDriver qk_drv_file;
extern const QkBlockDriver qk_drv_raw;
extern const QkBlockDriver qk_drv_qcow2;
extern const QkBlockDriver qk_drv_nbd;
extern const QkBlockDriver qk_drv_rbd;

/* Creates the host resource a name stands for (a file, an RBD image)
 * through its protocol driver: what format drivers create under them. */
int coroutine_fn qk_co_protocol_create(const char *filename, const QkCreateOptions *opts, QkError *err);
/* Opens the protocol node a name stands for (a file, an NBD export, an
 * RBD image), with no format node above it. */
QkBlock *coroutine_fn qk_co_protocol_open(const char *filename, int flags, QkError *err);

/* backing_name.c: the name to open for the backing file name BACKING of
 * IMAGE, and (json: names only, else NULL) the format it names; -ENOTSUP
 * or -EINVAL with the reason for a json: name qcowkit cannot follow. */
int qk_block_backing_resolve(const char *image, const char *backing, char **path, char **format, QkError *err);

/* Opens a protocol node (host file) directly. */
QkBlock *coroutine_fn qk_co_file_open(const char *filename, int flags, QkError *err);
/* Takes the image lock of a host-file node (file_lock.h's permissions);
 * nothing for other protocols. Released when the node closes. */
int qk_file_node_lock(QkBlock *bs, unsigned perm, unsigned shared, bool take_over, QkError *err);
/* Whether the local file under BS (a format node's, or BS itself) has
 * lost its last name: what is written to it goes when it is closed. */
bool qk_block_file_deleted(QkBlock *bs);

/* In-flight accounting for work that is not a request (e.g. VM-state
 * writes) but must hold off drain and close. */
void qk_block_inc_in_flight(QkBlock *bs);
void qk_block_dec_in_flight(QkBlock *bs);
/* Waits until no request is in flight on bs (and its children). */
void coroutine_fn qk_co_drain(QkBlock *bs);

#endif
