/*
 * qcowkit engine API: the coroutine-based layer under qcowkit.h, for
 * programs that need the whole engine rather than image I/O alone (the
 * qcowkit tools are built on it and on nothing else): block nodes and
 * their backing chains, block status, snapshots and VM state, dirty
 * bitmaps, check and repair, the copy jobs (convert, commit, rebase,
 * mirror), the NBD/control daemon, and the test hooks the tools expose.
 *
 * Threading: everything here runs on one thread's event loop. Functions
 * marked coroutine_fn may yield and are called only from a coroutine
 * (start one with qk_co_run or qk_coroutine_create/enter); the others may
 * be called from plain code on that thread. A second thread gets its own
 * loop and must not touch nodes opened on another.
 *
 * Stability: unlike qcowkit.h, this API follows the engine and may change
 * between minor versions (the exported symbols carry the version node
 * QCOWKIT_ENGINE_0). Errors are a negative errno plus a message in a
 * QkError, as in qcowkit.h; the library never prints or exits.
 */
#ifndef QCOWKIT_ENGINE_H
#define QCOWKIT_ENGINE_H

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <qcowkit/qcowkit.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Errors ---------------------------------------------------------- */


typedef struct QkError {
    int code;       /* negative errno, 0 when unset */
    char msg[3072]; /* room for two 1023-byte names, as in qemu-img's bitmap messages */
} QkError;

/* Set err (when not NULL and not already set) and return code (a
 * negative errno); the _errno form appends ": strerror(-code)". */
int qk_error_set(QkError *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int qk_error_set_errno(QkError *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- Sizes and buffers ----------------------------------------------- */

/* Human sizes: "64k", "1G", "512", "1.5M" (powers of 1024, as qemu-img);
 * 0 or -EINVAL/-ERANGE. qk_parse_uint takes plain decimal only. */
int qk_parse_size(const char *s, uint64_t *out);
int qk_parse_uint(const char *s, uint64_t *out);
/* "1 GiB", "64 KiB", "512 B" as qemu-img info prints sizes; returns buf. */
char *qk_format_size(uint64_t v, char *buf, size_t len);

/* A scatter-gather list for the vectored requests. */
typedef struct QkIov {
    struct iovec *iov;
    int niov;
    int nalloc;
    size_t size;
    struct iovec local[1]; /* storage for the one-buffer case */
} QkIov;

/* One buffer as a list (no allocation; nothing to destroy). */
void qk_iov_init_buf(QkIov *q, void *buf, size_t len);
int qk_buf_is_zero(const void *buf, size_t len);
/* Aligned allocation for O_DIRECT buffers; NULL on failure; free(). */
void *qk_aligned_alloc(size_t align, size_t size);

/* ---- Event loop and coroutines --------------------------------------- */

#ifndef coroutine_fn
#define coroutine_fn /* may yield: call only from a coroutine */
#endif

typedef struct QkLoop QkLoop;
typedef struct QkCoroutine QkCoroutine;
typedef void coroutine_fn QkCoroutineEntry(void *opaque);

/* The calling thread's loop, created on first use with the chosen
 * backend (see qk_set_aio_backend); destroy it before the thread ends. */
QkLoop *qk_loop_get(void);
void qk_loop_destroy_current(void);
/* "io_uring" or "threads": what the loop really uses. */
const char *qk_loop_backend_name(QkLoop *loop);

/* Runs the loop until *done becomes true (set by a coroutine). */
void qk_loop_run_until(QkLoop *loop, const bool *done);
/* Runs entry(opaque) in a new coroutine and the loop until it returns. */
void qk_co_run(QkCoroutineEntry *entry, void *opaque);

QkCoroutine *qk_coroutine_create(QkCoroutineEntry *entry, void *opaque);
void qk_coroutine_enter(QkCoroutine *co);

/* Monotonic nanoseconds; sleeping; waiting for fd readiness (POLLIN or
 * POLLOUT): the ready events, or -ETIMEDOUT after timeout_ns (< 0: never). */
int64_t qk_clock_ns(void);
void coroutine_fn qk_co_sleep_ns(int64_t ns);
int coroutine_fn qk_co_wait_fd(int fd, int events, int64_t timeout_ns);

/* A queue of coroutines waiting for an event. */
typedef struct QkCoWaiter {
    QkCoroutine *co;
    struct QkCoWaiter *next;
} QkCoWaiter;

typedef struct QkCoQueue {
    QkCoWaiter *head, *tail;
} QkCoQueue;

#define QK_CO_QUEUE_INIT {NULL, NULL}

/* Waits until woken; wakes every waiter queued at the time of the call. */
void coroutine_fn qk_co_queue_wait(QkCoQueue *q);
void qk_co_queue_wake_all(QkCoQueue *q);

/* Threads for CPU work done off the loop (compression); 0: default. */
void qk_work_pool_set_threads(unsigned n);

/* The tuning knobs qk_set_tunable sets, described for documentation. */
typedef enum QkTunable {
    QK_TUNE_URING_ASYNC_MIN,
    QK_TUNE_URING_ASYNC_MIN_WRITE,
    QK_TUNE_URING_WRITER,
    QK_TUNE_URING_COOP,
    QK_TUNE_BULK_READ_DIRECT,
    QK_TUNE_URING_SUBMIT_BATCH,
    QK_TUNE_URING_SEQ_MAX,
    QK_TUNE_LOOP_REAP_BATCH,
    QK_TUNE__COUNT,
} QkTunable;

typedef struct QkTunableInfo {
    const char *name; /* for qk_set_tunable */
    const char *env;  /* QCOWKIT_... */
    int64_t def;
    int64_t max;      /* accepted values are 0..max */
    const char *doc;
} QkTunableInfo;

/* t < QK_TUNE__COUNT. */
const QkTunableInfo *qk_tunable_info(QkTunable t);

/* ---- Block nodes ----------------------------------------------------- */

/* A node: a format (qcow2, raw) over a protocol child (file, nbd), with
 * its backing chain below. Opaque; read through the accessors below. */
typedef struct QkBlock QkBlock;

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
    /* Read-write over a file this process already has open read-only, in
     * a backing chain that never reads what this node writes (commit's
     * base). Otherwise the image lock refuses it, as it refuses a second
     * writer or a reader after a writer within the process. */
    QK_OPEN_TAKE_OVER = 1 << 8,
    /* Read-only, for reading metadata (info): an external data file that
     * cannot be opened is left out, and then reads of guest data and the
     * VM state fail with ENOMEDIUM. */
    QK_OPEN_METADATA_ONLY = 1 << 9,
    /* Let no one else write or resize the file while it is open, whatever
     * the format (a raw image is otherwise shared): the source of a copy,
     * as qemu-img convert opens its sources. QK_OPEN_FORCE_SHARE wins. */
    QK_OPEN_NO_SHARE = 1 << 10,
};

/* Request flags. */
enum {
    QK_REQ_FUA = 1 << 0,           /* data is stable when the request completes */
    QK_REQ_MAY_UNMAP = 1 << 1,     /* zero write may deallocate */
    QK_REQ_NO_FALLBACK = 1 << 2,   /* zero write: fail with -ENOTSUP rather than write zeros */
    /* Read: part of a bulk copy that will not be read again soon; a
     * page-cached file may serve an aligned one with O_DIRECT (unless most of
     * the range is in the page cache already). */
    QK_REQ_BULK_READ = 1 << 3,
    /* Write: store compressed. off is cluster-aligned and bytes whole
     * clusters (the last may end at the image's end); -ENOTSUP where the
     * format cannot compress. */
    QK_REQ_COMPRESSED = 1 << 4,
    /* Zero write into an image that is about to get a backing file (a
     * safe rebase of one that has none): the zeros must hide what that
     * file will show, so they are recorded even where nothing is below
     * yet. */
    QK_REQ_BACKING_PENDING = 1 << 5,
    /* Write: part of a stream that will not be written again soon (VM
     * state); a page-cached file starts writing it back at once, so that
     * the next flush does not find the whole stream still in memory. */
    QK_REQ_WRITE_BEHIND = 1 << 6,
    /* Bits 8..11 are the engine's own (what a driver writes, for fault
     * injection). */
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

/* Parses qemu-img's cache modes ("none", "writeback", "writethrough",
 * "directsync", "unsafe") into open flags; -EINVAL if unknown. */
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
    bool backing_unchecked;      /* with a size: the backing file is not opened */
} QkCreateOptions;

/* A persistent dirty bitmap stored in an image (qcow2), as info shows it. */
typedef struct QkBitmapInfo {
    char *name;
    uint64_t granularity;        /* bytes per bit */
    bool in_use;                 /* left in use: not consistent */
    bool auto_enabled;           /* the "auto" flag: tracks writes */
} QkBitmapInfo;

/* How an encrypted image is encrypted, as its headers say (qcowkit holds
 * no keys and reads no encrypted data: only a metadata-only open, as info
 * makes, accepts such an image). */
typedef struct QkEncryptSlotInfo {
    bool active;
    uint32_t iters;              /* active slots only */
    uint64_t key_offset;         /* bytes from the start of the LUKS header */
    uint32_t stripes;            /* active slots only */
} QkEncryptSlotInfo;

typedef struct QkEncryptInfo {
    const char *format;          /* "aes" (the legacy method) or "luks" */
    /* LUKS only; an empty string where the header names none. */
    char cipher_alg[16];         /* "aes-256" */
    char cipher_mode[8];         /* "xts" */
    char ivgen_alg[16];          /* "plain64" */
    char ivgen_hash_alg[16];     /* "sha256" with essiv, else "" */
    char hash_alg[16];           /* "sha256" */
    char uuid[41];
    uint64_t payload_offset;     /* bytes */
    uint32_t master_key_iters;
    QkEncryptSlotInfo slots[8];
} QkEncryptInfo;

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
    const QkEncryptInfo *encrypt; /* NULL unless encrypted; owned by the node */
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

/* Formats by name ("qcow2", "raw", "file", "nbd"). */
bool qk_format_known(const char *format);
/* True for an image format (not a protocol such as "file"). */
bool qk_format_is_image(const char *format);
/* True when images of the format can store persistent dirty bitmaps. */
bool qk_format_can_store_bitmaps(const char *format);
/* True when the format can store compressed clusters (QK_REQ_COMPRESSED). */
bool qk_format_can_compress(const char *format);

/* True for nbd://, nbd+unix://, nbds:// and nbds+unix:// names: these
 * open through the nbd protocol driver instead of as host files. */
bool qk_block_is_nbd_uri(const char *filename);
/* True for rbd:POOL/IMAGE... names (Ceph RBD images, as QEMU spells them). */
bool qk_block_is_rbd_name(const char *filename);
/* Either of those: a name that is no host file (never stat it). */
bool qk_block_is_remote(const char *filename);
/* Images in a backing chain at most, the top included: a deeper chain is
 * refused at open (QEMU has no fixed cap; a hostile chain of thousands of
 * files would hold as many descriptors and as much stack). */
#define QK_MAX_BACKING_CHAIN 128

/* The path to open for the backing file name an image records, resolved
 * as QEMU does (relative to the image's directory unless absolute, a URL,
 * "file:PATH" or a json: description of a local file, whose paths are
 * relative to the current directory). A json: name qcowkit cannot read is
 * returned as it is (opening it says why). NULL when out of memory;
 * free() the result. */
char *qk_block_backing_path(const char *image, const char *backing);

/* Opening and closing: the qk_co_ forms run in a coroutine, the plain
 * forms run the loop until done. close drains, flushes and frees the node
 * and its children; it returns 0 or the first error met writing back
 * (then data written since the last successful flush may be lost). */
QkBlock *coroutine_fn qk_co_block_open(const char *filename, const QkOpenOptions *opts, QkError *err);
QkBlock *qk_block_open(const char *filename, const QkOpenOptions *opts, QkError *err);
int coroutine_fn qk_co_block_close(QkBlock *bs);
int qk_block_close(QkBlock *bs);
int coroutine_fn qk_co_block_create(const char *filename, const QkCreateOptions *opts, QkError *err);
int qk_block_create(const char *filename, const QkCreateOptions *opts, QkError *err);

/* What a node is. The strings stay valid while the node is open. */
const char *qk_block_format_name(const QkBlock *bs);
/* True when no format was given and it was guessed from the image's first
 * bytes. A guessed raw image refuses writes that would make its first 512
 * bytes look like another format (-EPERM), as QEMU does: otherwise its
 * guest could write, say, a qcow2 header naming a host file as backing
 * file, read by the next open that guesses again. */
bool qk_block_format_probed(const QkBlock *bs);
/* Why the image stopped taking writes (it was found corrupt: a write
 * would have overwritten its own metadata, or an L2 entry cannot be
 * followed; a writable image is then marked corrupt), or NULL. */
const char *qk_block_corrupt_reason(const QkBlock *bs);
/* Why the image's stored dirty bitmaps cannot be used (a damaged bitmap
 * directory or entry, which a read-write open refuses), or NULL. */
const char *qk_block_bitmaps_problem(const QkBlock *bs);
/* Called once per image when it is found corrupt, with the reason in
 * QEMU's words; marked: the image is writable, so it gets the header's
 * corrupt bit. For a tool to say it as qemu-img does. Process-wide: set it
 * once, before images are opened. NULL (the default): nothing is called. */
typedef void QkCorruptHook(const QkBlock *bs, bool marked, const char *msg);
void qk_block_set_corrupt_hook(QkCorruptHook *fn);
const char *qk_block_filename(const QkBlock *bs);
/* The protocol child (NULL for a protocol node) and the backing node
 * (NULL when none or not opened). */
QkBlock *qk_block_file(const QkBlock *bs);
QkBlock *qk_block_backing(const QkBlock *bs);
/* The backing file name and format as the image records them, or NULL. */
const char *qk_block_backing_file(const QkBlock *bs);
const char *qk_block_backing_format(const QkBlock *bs);
/* Buffer alignment direct I/O on the node needs (1 when none). */
uint32_t qk_block_mem_alignment(const QkBlock *bs);
int64_t qk_block_length(QkBlock *bs);
void qk_block_get_info(QkBlock *bs, QkImageInfo *info);
bool qk_block_is_qcow2(const QkBlock *bs);
/* What the node's format can do. */
bool qk_block_can_compress(const QkBlock *bs);
bool qk_block_can_amend(const QkBlock *bs);
bool qk_block_can_change_backing(const QkBlock *bs);

/* Requests: 0 or -errno. qiov_off is where in qiov the bytes start. */
int coroutine_fn qk_co_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                              size_t qiov_off, int flags);
int coroutine_fn qk_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                               size_t qiov_off, int flags);
int coroutine_fn qk_co_pread(QkBlock *bs, uint64_t off, uint64_t bytes, void *buf, int flags);
int coroutine_fn qk_co_pwrite(QkBlock *bs, uint64_t off, uint64_t bytes, const void *buf, int flags);
int coroutine_fn qk_co_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags);
int coroutine_fn qk_co_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes);
int coroutine_fn qk_co_flush(QkBlock *bs);
/* Status of [off, off+bytes): QK_BS_* flags for the first *pnum bytes
 * (> 0); map and file (either may be NULL) say where the data is. */
int coroutine_fn qk_co_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                    uint64_t *map, QkBlock **file);
/* Status across the backing chain: ALLOCATED means some layer has it;
 * *depth (may be NULL) is that layer (0: bs itself). */
int coroutine_fn qk_co_block_status_above(QkBlock *bs, uint64_t off, uint64_t bytes,
                                          uint64_t *pnum, int *depth);
int coroutine_fn qk_co_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err);
/* Drops everything the node holds so its backing shows through
 * everywhere (after commit); -ENOTSUP when the format cannot. Its dirty
 * bitmaps are left as they are: after a commit what it reads has not
 * changed (a caller emptying it for another reason marks them itself). */
int coroutine_fn qk_co_make_empty(QkBlock *bs);
/* Records another backing file (name NULL: none) and its format in the
 * image, durably; the open chain stays as it was. -ENOTSUP when the
 * format has no backing file. */
int coroutine_fn qk_co_change_backing(QkBlock *bs, const char *name, const char *fmt, QkError *err);
/* Changes the image's options; -ENOTSUP when the format has none. */
int coroutine_fn qk_co_amend(QkBlock *bs, const QkAmendOptions *o, QkError *err);

/* ---- Internal snapshots and VM state --------------------------------- */

typedef struct QkSnapshotInfo {
    char *id;                  /* create: NULL picks the next free number */
    char *name;
    uint64_t vm_state_size;    /* bytes of VM state saved with it */
    uint32_t date_sec;         /* create: 0 and 0 mean now */
    uint32_t date_nsec;
    uint64_t vm_clock_nsec;
    uint64_t disk_size;        /* virtual size when taken (create ignores it) */
    int64_t icount;            /* -1 when not recorded */
} QkSnapshotInfo;

/* True when the node's format stores internal snapshots. */
bool qk_block_has_snapshots(const QkBlock *bs);
/* The snapshot table; free with qk_snapshot_list_free. */
int coroutine_fn qk_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err);
void qk_snapshot_list_free(QkSnapshotInfo *list, int n);
/* Snapshots the active disk and the VM state written to the node
 * (info->vm_state_size bytes of it). Ids must be unique (-EEXIST). */
int coroutine_fn qk_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err);
/* Makes the snapshot whose id is id_or_name, else the first one so named,
 * the active disk; *vm_state_size (may be NULL) gets its state's length. */
int coroutine_fn qk_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                     QkError *err);
/* Deletes the first snapshot matching id (when not NULL) and name (when
 * not NULL). */
int coroutine_fn qk_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err);
/* Read-only nodes: shows the snapshot's contents in place of the active
 * disk until close (convert -l). */
int coroutine_fn qk_co_snapshot_load_tmp(QkBlock *bs, const char *id, const char *name, QkError *err);
/* Drops the VM state written to the active disk since the last snapshot. */
int coroutine_fn qk_co_vmstate_discard(QkBlock *bs, QkError *err);

/* VM state, buffered: small unaligned pieces gathered into large aligned
 * buffers written (or read ahead) several at once. */
typedef struct QkVmStateOptions {
    uint64_t buf_size;   /* 0: max(cluster size, 2 MiB); rounded up to 4 KiB */
    int workers;         /* buffers written/read in parallel; 0: 4 */
    bool unbuffered;     /* every piece is written as it comes (the slow path) */
    uint32_t cluster_size; /* hint for the default buffer size */
} QkVmStateOptions;

typedef struct QkVmStateWriter QkVmStateWriter;
typedef struct QkVmStateReader QkVmStateReader;
/* Where buffers go to or come from; NULL: the node's own VM state area
 * (qk_co_save_vmstate / qk_co_load_vmstate). */
typedef int coroutine_fn QkVmStateIo(QkBlock *bs, QkIov *qiov, uint64_t pos);

int coroutine_fn qk_co_save_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos);
int coroutine_fn qk_co_load_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos);

QkVmStateWriter *qk_vmstate_writer_new(QkBlock *bs, const QkVmStateOptions *opts, QkVmStateIo *sink);
int coroutine_fn qk_vmstate_write(QkVmStateWriter *w, uint64_t pos, const void *buf, size_t len);
int coroutine_fn qk_vmstate_writer_flush(QkVmStateWriter *w);
void qk_vmstate_writer_free(QkVmStateWriter *w);
QkVmStateReader *qk_vmstate_reader_new(QkBlock *bs, uint64_t size, const QkVmStateOptions *opts,
                                       QkVmStateIo *source);
/* Bytes read (short only at the end), or -errno. */
int64_t coroutine_fn qk_vmstate_read(QkVmStateReader *r, uint64_t pos, void *buf, size_t len);
void coroutine_fn qk_vmstate_reader_close(QkVmStateReader *r);

/* ---- Dirty bitmaps --------------------------------------------------- */

/* A bitmap of a node: every completed write, zero write and discard marks
 * it while enabled. Persistent ones are stored in the image (qcow2) when
 * the node closes. */
typedef struct QkDirtyBitmap QkDirtyBitmap;

/* Adds a bitmap; name must be unique on bs (NULL for an anonymous one). */
QkDirtyBitmap *qk_dirty_bitmap_add(QkBlock *bs, const char *name, uint64_t granularity, QkError *err);
/* A new bitmap the image stores: fails (with qemu-img's message) when
 * the format or image cannot store it. */
QkDirtyBitmap *qk_dirty_bitmap_add_persistent(QkBlock *bs, const char *name, uint64_t granularity,
                                              QkError *err);
QkDirtyBitmap *qk_dirty_bitmap_find(QkBlock *bs, const char *name);
/* Walks a node's bitmaps, newest first. */
QkDirtyBitmap *qk_dirty_bitmap_first(QkBlock *bs);
QkDirtyBitmap *qk_dirty_bitmap_next(QkDirtyBitmap *bm);
const char *qk_dirty_bitmap_name(const QkDirtyBitmap *bm);
uint64_t qk_dirty_bitmap_granularity(const QkDirtyBitmap *bm);
bool qk_dirty_bitmap_enabled(const QkDirtyBitmap *bm);
bool qk_dirty_bitmap_persistent(const QkDirtyBitmap *bm);
/* Found in use (not stored after a crash): it can only be removed. */
bool qk_dirty_bitmap_inconsistent(const QkDirtyBitmap *bm);

/* Fails with -EBUSY while the bitmap is in use. While the image may be
 * written before it is closed, use qk_co_dirty_bitmap_remove: this one
 * leaves a stored copy of the bitmap as it is on disk until the close. */
int qk_dirty_bitmap_remove(QkBlock *bs, QkDirtyBitmap *bm, QkError *err);
/* As qk_dirty_bitmap_remove, but a stored copy leaves the image now (a
 * new bitmap directory without it, the header switched durably), so a
 * crash before the close never brings the bitmap back. May yield. */
int coroutine_fn qk_co_dirty_bitmap_remove(QkBlock *bs, QkDirtyBitmap *bm, QkError *err);
void qk_dirty_bitmap_set_enabled(QkDirtyBitmap *bm, bool enabled);
void qk_dirty_bitmap_clear(QkDirtyBitmap *bm);
/* dst |= src: same size; granularities may differ (src's ranges are
 * widened to dst's). */
int qk_dirty_bitmap_merge(QkDirtyBitmap *dst, const QkDirtyBitmap *src, QkError *err);

/* ---- Check and repair ------------------------------------------------ */

enum {
    QK_CHECK_FIX_LEAKS = 1 << 0,
    QK_CHECK_FIX_ERRORS = 1 << 1,
};

typedef struct QkCheckResult {
    int corruptions;          /* still present after the check */
    int leaks;
    int check_errors;         /* the check itself could not read something */
    int corruptions_fixed;
    int leaks_fixed;
    uint64_t image_end_offset;
    uint64_t total_clusters;  /* clusters of guest data the image can map */
    uint64_t allocated_clusters;
    uint64_t fragmented_clusters;
    uint64_t compressed_clusters;
} QkCheckResult;

/* Receives one line of the check's report (qemu-img's wording, no
 * trailing newline), e.g. "Leaked cluster 5 refcount=1 reference=0". */
typedef void QkCheckReport(void *opaque, const char *line);
/* Checks a qcow2 node opened with QK_OPEN_CHECK, repairing what fix asks
 * for (the node must then be writable). Returns 0 when the check ran (res
 * says what it found), or -errno when it could not complete. */
int coroutine_fn qk_qcow2_co_check(QkBlock *bs, int fix, QkCheckResult *res,
                                   QkCheckReport *report, void *opaque, QkError *err);

/* ---- Copy jobs ------------------------------------------------------- */

typedef void QkJobProgress(uint64_t done, uint64_t total, void *opaque);

typedef struct QkConvertOptions {
    QkBlock **src;               /* the sources, concatenated in this order */
    int nb_src;
    QkBlock *dst;                /* at least as large as the sources together */
    /* The target reads as zeros wherever it is not written (a new image
     * without a backing file, or --target-is-zero): zeros are skipped
     * rather than written. */
    bool target_zero;
    /* The target has a backing file of its own (-B): only what each
     * source's top layer holds is copied; ranges it leaves to its backing
     * chain are not written, so the target's backing shows there. */
    bool top_only;
    /* All-zero data over an aligned unit of this many bytes is written
     * as a hole; 0 writes everything as data. */
    uint64_t sparse;
    bool compress;               /* every written cluster QK_REQ_COMPRESSED */
    int workers;                 /* coroutines copying at once (1..16) */
    bool out_of_order;           /* writes need not reach the target in order */
    uint64_t rate;               /* source bytes read per second; 0: no limit */
    /* Only the ranges dirty in this bitmap of the (single) source are
     * copied (an incremental backup); NULL copies everything. */
    const QkDirtyBitmap *only;
    QkJobProgress *progress;     /* may be NULL */
    void *opaque;
    /* --salvage: a source read that fails is retried 512 bytes at a time;
     * each piece that still fails is copied as zeros and reported to
     * salvaged(off, -errno, opaque) (off in the concatenated sources)
     * instead of ending the copy. */
    bool salvage;
    void (*salvaged)(uint64_t off, int err, void *opaque);
} QkConvertOptions;

/* Copies; returns 0 or the first error (-errno), with err saying what
 * failed where ("error while reading at byte N: ..." as qemu-img says it).
 * The target is flushed at the end. -ENOTSUP from a compressed write means
 * the target's format cannot compress. */
int coroutine_fn qk_co_convert(const QkConvertOptions *o, QkError *err);

typedef struct QkCommitOptions {
    int workers;                 /* coroutines copying at once (1..64) */
    uint64_t rate;               /* bytes/s copied at most; 0: no limit */
    QkJobProgress *progress;     /* may be NULL */
    void *opaque;
} QkCommitOptions;

/* Copies every range of top whose data comes from a layer above depth
 * base_depth (0 is top itself) into base, read through top's chain.
 * Grows base to top's size first if it is smaller. Returns 0 or -errno
 * (base then holds part of the data: the caller must not empty top). */
int coroutine_fn qk_co_commit_copy(QkBlock *top, int base_depth, QkBlock *base,
                                   const QkCommitOptions *opts);

typedef struct QkRebaseOptions {
    int workers;                 /* coroutines comparing at once (1..64) */
    bool compress;               /* differing clusters written compressed */
    QkJobProgress *progress;     /* may be NULL */
    void *opaque;
} QkRebaseOptions;

/* Writes into top (opened read-write with its current chain) what reads
 * through its chain give wherever that differs from new_backing (NULL:
 * none, reads as zeros; past its end, zeros too). Compares and writes in
 * units of top's allocation granularity. top is flushed at the end, so
 * the caller may record the new backing file only after this returned 0. */
int coroutine_fn qk_co_rebase_copy(QkBlock *top, QkBlock *new_backing, const QkRebaseOptions *opts);

/* Handles [off, off+len) with buf (buf_size bytes); 0 or -errno. May yield. */
typedef int coroutine_fn QkSliceFn(void *opaque, uint64_t off, uint64_t len, void *buf);
/* Runs fn over [0, size) in slices of slice bytes with workers (1..64)
 * coroutines, each given a buffer of buf_size bytes aligned to align (a
 * power of two; -EINVAL otherwise).
 * Returns the first error, after every worker has stopped. */
int coroutine_fn qk_co_run_slices(uint64_t size, uint64_t slice, int workers, size_t buf_size,
                                  size_t align, QkSliceFn *fn, void *opaque);

/* Long-running jobs (mirror, backup): a coroutine each on the loop. */
typedef struct QkJob QkJob;

typedef enum QkJobState {
    QK_JOB_CREATED,
    QK_JOB_RUNNING,
    QK_JOB_READY,
    QK_JOB_COMPLETED,
    QK_JOB_CANCELLED,
    QK_JOB_FAILED,
} QkJobState;

QkJobState qk_job_state(const QkJob *job);
bool qk_job_is_finished(const QkJob *job);
/* The failed job's message ("" otherwise). */
const char *qk_job_error(const QkJob *job);
void qk_job_progress(const QkJob *job, uint64_t *done, uint64_t *total);
/* Removes a finished job from the list and frees it. */
void qk_job_free(QkJob *job);

typedef enum QkMirrorMode {
    QK_MIRROR_BACKGROUND,
    QK_MIRROR_WRITE_BLOCKING,
} QkMirrorMode;

/* LOW runs the copies' host I/O on the nice-19 pool; AUTO is NORMAL (on
 * a 2-core machine LOW starved the copy under a busy writer). */
typedef enum QkMirrorPriority {
    QK_MIRROR_PRIO_AUTO,
    QK_MIRROR_PRIO_LOW,
    QK_MIRROR_PRIO_NORMAL,
} QkMirrorPriority;

/* Called at the moment of the switch: the source is quiesced (no write in
 * flight, new ones held) and the target holds the same bytes. */
typedef void QkMirrorSwitchFn(void *opaque, QkBlock *source, QkBlock *target);

typedef struct QkMirrorOptions {
    uint64_t granularity;     /* 0: target cluster size clamped to 4K..64K */
    uint64_t buf_size;        /* bytes of copy buffers in flight; 0: 16 MiB */
    int max_in_flight;        /* copies at once; 0: 16 */
    uint64_t speed;           /* bytes/s; 0: unlimited */
    QkMirrorMode mode;
    uint64_t ready_threshold; /* ready when dirty bytes <= this; default 0 */
    bool target_is_zero;      /* fresh target: the bulk pass skips zeroes */
    bool rescan_per_chunk;    /* ablation: restart the walk and drain per chunk */
    bool chase_writes;        /* ablation: background passes run back to back whatever the write rate */
    QkMirrorPriority copy_priority; /* CPU priority of the copies' host I/O */
    QkMirrorSwitchFn *switch_fn;
    void *switch_opaque;
} QkMirrorOptions;

/* Parse "background" / "write-blocking" and "low" / "normal" / "auto";
 * -EINVAL otherwise. */
int qk_mirror_mode_parse(const char *s, QkMirrorMode *mode);
int qk_mirror_priority_parse(const char *s, QkMirrorPriority *prio);
/* Opens a mirror's target (flags and format in opts) with the cache mode
 * CACHE ("none", "writeback", ... as qemu-img names them). With CACHE
 * NULL a local file target gets O_DIRECT ("none"), as a VM's disk would,
 * and falls back to the page cache where the file system refuses
 * O_DIRECT; an NBD target ignores it. *used gets the mode opened. */
QkBlock *coroutine_fn qk_mirror_open_target(const char *target, const QkOpenOptions *opts, const char *cache,
                                            const char **used, QkError *err);
/* Creates and starts a mirror job: copies source to target while source
 * stays writable; READY once the copy has caught up. Neither node is
 * owned by the job; both must stay open until it has finished. The
 * target must be at least as large as the source. */
QkJob *qk_mirror_start(const char *id, QkBlock *source, QkBlock *target,
                       const QkMirrorOptions *opts, QkError *err);
/* Requests completion (the job must be ready); do_switch runs the switch
 * callback under quiesce before the job ends. */
int qk_mirror_complete(QkJob *job, bool do_switch, QkError *err);

/* ---- The daemon (qcowkit serve) -------------------------------------- */

typedef struct QkExportSpec {
    char *name;
    char *file;
    char *format;         /* NULL: probe (nbd URIs: raw) */
    char *cache;          /* NULL: writeback */
    char *description;
    bool readonly;
    uint64_t cache_size;  /* qcow2 metadata cache bound in bytes; 0: default */
} QkExportSpec;

/* Parses "name=N,file=F,format=...,cache=...,readonly=on,..." (or a bare
 * file name); clear frees what parse allocated. */
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
    int handshake_limit;       /* seconds for a client's handshake; 0: default (10), < 0: none */
} QkDaemonConfig;

/* Runs until SIGTERM/SIGINT or the "quit" command, then shuts down
 * cleanly. From plain code. Returns 0, or -errno with err set when
 * startup failed. */
int qk_daemon_run(const QkDaemonConfig *cfg, QkError *err);

/* ---- Test hooks ------------------------------------------------------ */

/* Breakpoints on engine events ("write_aio", "l2_update", ...), as
 * qemu-io's break/resume: a request reaching an armed event pauses until
 * resumed. */
int qk_debug_event_parse(const char *name);      /* the event, or -1 if unknown */
/* Arms a one-shot breakpoint. Returns -EEXIST if the tag is in use. */
int qk_debug_break(int event, const char *tag);
/* Removes a breakpoint that has not fired yet. -ENOENT if none. */
int qk_debug_remove_break(const char *tag);
/* Waits until a request is paused at tag (returns at once if it is). */
void coroutine_fn qk_debug_wait_break(const char *tag);
/* Resumes the request paused at tag; -ENOENT if none is paused there. */
int qk_debug_resume(const char *tag);

/* Fault injection (QCOWKIT_INJECT's rules): replaces the rule set and
 * zeroes the counters (NULL or "" disarms); the counters as one line,
 * "write 12 (data 5, header 1, ...), flush 3; 1 fault(s) injected". */
int qk_inject_configure(const char *spec, QkError *err);
void qk_inject_stats(char *buf, size_t len);

/* A marker in the write log QCOWKIT_LOG_WRITES names (crash tests), in
 * the same order as the records around it. 0 when logging is off. */
int qk_write_log_mark(const char *text);

#ifdef __cplusplus
}
#endif

#endif
