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

typedef struct QkBlock QkBlock;
typedef struct QkBlockDriver QkBlockDriver;
struct QkDirtyBitmap;
typedef struct QkSnapshotInfo QkSnapshotInfo; /* block/snapshot.h */

/* Open flags. */
enum {
    QK_OPEN_RDWR = 1 << 0,
    QK_OPEN_NOCACHE = 1 << 1,      /* O_DIRECT on the host file */
    QK_OPEN_WRITETHROUGH = 1 << 2, /* every write is followed by a flush */
    QK_OPEN_NO_FLUSH = 1 << 3,     /* "unsafe": flushes are ignored */
    QK_OPEN_NO_BACKING = 1 << 4,   /* do not open the backing chain */
    QK_OPEN_FORCE_SHARE = 1 << 5,
    QK_OPEN_CHECK = 1 << 6,        /* opened by check: tolerate some corruption */
    QK_OPEN_LOAD_BITMAPS = 1 << 7, /* read-only too: load the persistent bitmaps (a merge source) */
};

/* Request flags. */
enum {
    QK_REQ_FUA = 1 << 0,           /* data is stable when the request completes */
    QK_REQ_MAY_UNMAP = 1 << 1,     /* zero write may deallocate */
    QK_REQ_NO_FALLBACK = 1 << 2,   /* zero write: fail with -ENOTSUP rather than write zeros */
    /* Read: part of a bulk copy (a mirror's pass) that will not be read
     * again soon. A host file opened through the page cache may serve it
     * with O_DIRECT from a second descriptor when the request is aligned:
     * the kernel writes back dirty pages of the range first, so the data
     * is the same, at a third of the CPU and without filling the cache. */
    QK_REQ_BULK_READ = 1 << 3,
    /* Write: store compressed (convert -c, qemu-io write -c). off is
     * cluster-aligned and bytes whole clusters, the last one may end at
     * the image's end; -ENOTSUP where the format cannot compress. */
    QK_REQ_COMPRESSED = 1 << 4,
    /* Bits 8..11 say what a format driver writes to its file (QK_REQ_KIND
     * in block/inject.h), so fault injection can pick metadata writes. */
};

/* Block status flags (a superset of what NBD base:allocation needs). */
enum {
    QK_BS_DATA = 1 << 0,           /* reads return data (not known zero) */
    QK_BS_ZERO = 1 << 1,           /* reads return zeros */
    QK_BS_OFFSET_VALID = 1 << 2,   /* *map is the host offset in *file */
    QK_BS_ALLOCATED = 1 << 3,      /* this layer has content here (not the backing) */
    QK_BS_EOF = 1 << 4,
};

/* Preallocation modes for create/truncate. */
typedef enum QkPrealloc {
    QK_PREALLOC_OFF = 0,
    QK_PREALLOC_METADATA,
    QK_PREALLOC_FALLOC,
    QK_PREALLOC_FULL,
} QkPrealloc;

/* Cache modes as qemu-img names them. */
typedef enum QkCacheMode {
    QK_CACHE_WRITEBACK = 0,
    QK_CACHE_NONE,
    QK_CACHE_WRITETHROUGH,
    QK_CACHE_DIRECTSYNC,
    QK_CACHE_UNSAFE,
} QkCacheMode;

/* Parses "none", "writeback", ... into open flags; -EINVAL if unknown. */
int qk_cache_mode_parse(const char *name, int *flags);

typedef struct QkOpenOptions {
    int flags;
    const char *format;          /* NULL: probe */
    uint64_t cache_size;         /* metadata cache in bytes; 0: driver default */
    bool strict_alloc_deps;      /* qcow2: every write to a cluster being allocated waits */
    int compress_level;          /* qcow2 compressed writes; 0: the type's default */
} QkOpenOptions;

typedef struct QkCreateOptions {
    const char *format;
    uint64_t size;
    bool size_set;
    uint32_t cluster_size;       /* 0: default 64 KiB */
    uint32_t refcount_bits;      /* 0: default 16 */
    int compat;                  /* 2 (0.10) or 3 (1.1); 0: default 3 */
    bool lazy_refcounts;
    bool extended_l2;
    QkPrealloc prealloc;
    const char *backing_file;
    const char *backing_fmt;
    int compression_type;        /* 0 zlib, 1 zstd */
    const char *data_file;       /* qcow2: guest data goes to this new file */
    bool data_file_raw;          /* ... kept a valid raw image of the disk */
} QkCreateOptions;

/* A persistent dirty bitmap stored in an image (qcow2), as info shows it. */
typedef struct QkBitmapInfo {
    char *name;
    uint64_t granularity;        /* bytes per bit */
    bool in_use;                 /* left in use: not consistent */
    bool auto_enabled;           /* the "auto" flag: tracks writes */
} QkBitmapInfo;

/* Everything `info` shows. Drivers fill what they know. */
typedef struct QkImageInfo {
    const char *format;
    uint64_t virtual_size;
    int64_t actual_size;         /* bytes allocated on the host; -1 unknown */
    uint32_t cluster_size;       /* 0 when not applicable */
    const char *backing_file;
    const char *backing_format;
    int qcow2_version;           /* 2 or 3; 0 for other formats */
    uint32_t refcount_bits;
    bool lazy_refcounts;
    bool corrupt;
    bool extended_l2;
    bool dirty;
    const char *compression_type;
    int nb_snapshots;
    const QkBitmapInfo *bitmaps; /* owned by the node; valid while it is open */
    int nb_bitmaps;
    bool bitmaps_stale;          /* bitmaps stored, but their autoclear bit is clear */
    const char *data_file;       /* external data file as the image names it, or NULL */
    bool data_file_raw;
} QkImageInfo;

/* What amend changes (qemu-img amend -o); unset fields stay as they are. */
typedef struct QkAmendOptions {
    int compat;                  /* 0: keep; 2 (0.10) or 3 (1.1) */
    int lazy_refcounts;          /* -1: keep; 0 off; 1 on */
    uint32_t refcount_bits;      /* 0: keep */
    bool size_set;
    uint64_t size;
    const char *data_file;       /* NULL: keep; "": drop the name; else rename */
    bool data_file_raw_set;      /* data_file_raw given: only off is allowed */
    bool data_file_raw;
    void (*progress)(uint64_t done, uint64_t total, void *opaque);
    void *opaque;
    /* Only decide whether the amend would be refused (the image may be
     * open read-only): a read-write open changes the header already. */
    bool check_only;
} QkAmendOptions;

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
};

struct QkBlock {
    const QkBlockDriver *drv;
    void *opaque;                 /* driver state, instance_size bytes */
    char *filename;
    int open_flags;
    bool read_only;
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

/* Driver registry. */
const QkBlockDriver *qk_block_find_driver(const char *format);
extern const QkBlockDriver qk_drv_file;
extern const QkBlockDriver qk_drv_raw;
extern const QkBlockDriver qk_drv_qcow2;
extern const QkBlockDriver qk_drv_nbd;
/* True for nbd://, nbd+unix://, nbds:// and nbds+unix:// names: these open
 * through the nbd protocol driver instead of as host files. */
bool qk_block_is_nbd_uri(const char *filename);
/* The path to open for the backing file name an image records: as it is
 * when absolute, a URL (nbd://, nbd+unix://, ...) or QEMU's legacy
 * "nbd:" form, or when the image's own name has no directory; else
 * relative to the image's directory, as QEMU resolves it. Every caller
 * (opening a chain, create's size check, info's "actual path") uses this
 * one. NULL when out of memory; free() the result. */
char *qk_block_backing_path(const char *image, const char *backing);

/* Opening and closing. qk_co_* variants run in a coroutine; the plain
 * variants run the loop until done and may be called from plain code. */
QkBlock *coroutine_fn qk_co_block_open(const char *filename, const QkOpenOptions *opts, QkError *err);
QkBlock *qk_block_open(const char *filename, const QkOpenOptions *opts, QkError *err);
/* Opens a protocol node (host file) directly. */
QkBlock *coroutine_fn qk_co_file_open(const char *filename, int flags, QkError *err);
/* Drains, flushes and frees bs and its children. Returns 0 or the first
 * error met while writing back (the final flush, metadata, the dirty bit):
 * then data written since the last successful flush may be lost. */
int coroutine_fn qk_co_block_close(QkBlock *bs);
int qk_block_close(QkBlock *bs);
int coroutine_fn qk_co_block_create(const char *filename, const QkCreateOptions *opts, QkError *err);
int qk_block_create(const char *filename, const QkCreateOptions *opts, QkError *err);

/* Requests. Return 0 or -errno. qiov_off is where in qiov the bytes start. */
int coroutine_fn qk_co_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                              size_t qiov_off, int flags);
int coroutine_fn qk_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                               size_t qiov_off, int flags);
int coroutine_fn qk_co_pread(QkBlock *bs, uint64_t off, uint64_t bytes, void *buf, int flags);
int coroutine_fn qk_co_pwrite(QkBlock *bs, uint64_t off, uint64_t bytes, const void *buf, int flags);
int coroutine_fn qk_co_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags);
int coroutine_fn qk_co_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes);
int coroutine_fn qk_co_flush(QkBlock *bs);
int coroutine_fn qk_co_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                    uint64_t *map, QkBlock **file);
/* Status across the backing chain: ALLOCATED means some layer has it. */
int coroutine_fn qk_co_block_status_above(QkBlock *bs, uint64_t off, uint64_t bytes,
                                          uint64_t *pnum, int *depth);
int coroutine_fn qk_co_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err);
/* See QkBlockDriver.co_make_empty; -ENOTSUP when the format cannot. */
int coroutine_fn qk_co_make_empty(QkBlock *bs);
/* See QkBlockDriver.co_change_backing; -ENOTSUP when the format has no
 * backing file. Waits for requests in flight first. */
int coroutine_fn qk_co_change_backing(QkBlock *bs, const char *name, const char *fmt, QkError *err);
/* See QkBlockDriver.co_amend; -ENOTSUP when the format has no options. */
int coroutine_fn qk_co_amend(QkBlock *bs, const QkAmendOptions *o, QkError *err);
int64_t qk_block_length(QkBlock *bs);

/* In-flight accounting for work that is not a request (e.g. VM-state
 * writes) but must hold off drain and close. */
void qk_block_inc_in_flight(QkBlock *bs);
void qk_block_dec_in_flight(QkBlock *bs);
/* Waits until no request is in flight on bs (and its children). */
void coroutine_fn qk_co_drain(QkBlock *bs);

void qk_block_get_info(QkBlock *bs, QkImageInfo *info);

#endif
