/*
 * Internal state of the qcow2 driver, shared by its files: the parsed
 * header, the in-memory L1 and refcount tables, the metadata caches and
 * the list of requests in flight. Nothing outside src/qcow2 includes this.
 */
#ifndef QK_QCOW2_QCOW2_INT_H
#define QK_QCOW2_QCOW2_INT_H

#include <endian.h>
#include <stdbool.h>
#include <stdint.h>

#include "aio/co_sync.h"
#include "block/block.h"
#include "block/inject.h"
#include "qcow2/qcow2.h"
#include "common/byteorder.h"
#include "common/checked.h"
#include "util/error.h"

#define QCOW2_MAGIC 0x514649fbU

#define QCOW2_MIN_CLUSTER_BITS 9
#define QCOW2_MAX_CLUSTER_BITS 21
#define QCOW2_MAX_L1_BYTES (32ULL << 20)
#define QCOW2_MAX_REFTABLE_BYTES (8ULL << 20)
#define QCOW2_MAX_SNAPSHOTS 65536
#define QCOW2_MAX_SNAPSHOT_TABLE_BYTES (64ULL << 20)
#define QCOW2_MAX_BACKING_NAME 1023
/* Ours, not QEMU's (it reads extensions up to the end of cluster 0): real
 * images carry a handful. */
#define QCOW2_MAX_HEADER_EXTENSIONS 1024
/* Host offsets must fit the 56-bit offset fields of L1/L2 entries. */
#define QCOW2_MAX_HOST_OFFSET (1ULL << 56)

#define QCOW2_INCOMPAT_DIRTY (1ULL << 0)
#define QCOW2_INCOMPAT_CORRUPT (1ULL << 1)
#define QCOW2_INCOMPAT_DATA_FILE (1ULL << 2)
#define QCOW2_INCOMPAT_COMPRESSION (1ULL << 3)
#define QCOW2_INCOMPAT_EXTL2 (1ULL << 4)
#define QCOW2_INCOMPAT_KNOWN 0x1fULL
#define QCOW2_COMPAT_LAZY_REFCOUNTS (1ULL << 0)
#define QCOW2_AUTOCLEAR_BITMAPS (1ULL << 0)
#define QCOW2_AUTOCLEAR_DATA_FILE_RAW (1ULL << 1)

#define QCOW2_EXT_END 0x00000000U
#define QCOW2_EXT_BACKING_FORMAT 0xe2792acaU
#define QCOW2_EXT_FEATURE_TABLE 0x6803f857U
#define QCOW2_EXT_BITMAPS 0x23852875U
#define QCOW2_EXT_CRYPTO 0x0537be77U
#define QCOW2_EXT_DATA_FILE 0x44415441U

/* Header crypt_method values. */
#define QCOW2_CRYPT_AES 1U
#define QCOW2_CRYPT_LUKS 2U

#define QCOW2_OFLAG_COPIED (1ULL << 63)
#define QCOW2_OFLAG_COMPRESSED (1ULL << 62)
#define QCOW2_OFLAG_ZERO 1ULL
#define QCOW2_L1E_OFFSET_MASK 0x00fffffffffffe00ULL
#define QCOW2_L1E_RESERVED 0x7f000000000001ffULL
#define QCOW2_L2E_OFFSET_MASK 0x00fffffffffffe00ULL
#define QCOW2_L2E_RESERVED 0x3f000000000001feULL
#define QCOW2_REFT_OFFSET_MASK 0xfffffffffffffe00ULL
#define QCOW2_BITMAP_ALL_ALLOC 0x00000000ffffffffULL
#define QCOW2_BITMAP_ALL_ZERO 0xffffffff00000000ULL

#define QCOW2_HEADER_V2_LEN 72
#define QCOW2_HEADER_V3_LEN 104
#define QCOW2_HEADER_WRITE_LEN 112

/* Header field byte offsets, for in-place field updates. */
#define QCOW2_HOFF_SIZE 24
#define QCOW2_HOFF_L1 36            /* l1_size + l1_table_offset */
#define QCOW2_HOFF_REFTABLE 48      /* refcount_table_offset + clusters */
#define QCOW2_HOFF_INCOMPAT 72
#define QCOW2_HOFF_AUTOCLEAR 88
#define QCOW2_HOFF_COMPAT 80
#define QCOW2_HOFF_REFCOUNT_ORDER 96

typedef struct Qcow2State Qcow2State;
typedef struct Qcow2Cache Qcow2Cache;

/* The parsed fixed header, in host byte order. */
typedef struct Qcow2Header {
    uint32_t magic;
    uint32_t version;
    uint64_t backing_file_offset;
    uint32_t backing_file_size;
    uint32_t cluster_bits;
    uint64_t size;
    uint32_t crypt_method;
    uint32_t l1_size;
    uint64_t l1_table_offset;
    uint64_t refcount_table_offset;
    uint32_t refcount_table_clusters;
    uint32_t nb_snapshots;
    uint64_t snapshots_offset;
    uint64_t incompatible_features;
    uint64_t compatible_features;
    uint64_t autoclear_features;
    uint32_t refcount_order;
    uint32_t header_length;
    uint8_t compression_type;
} Qcow2Header;

/* What one unit (a cluster, or a subcluster with extended L2) maps to. */
typedef enum Qcow2Type {
    QCOW2_UNALLOC,       /* this layer has nothing: backing or zeros */
    QCOW2_ZERO_PLAIN,    /* reads as zero, no host cluster */
    QCOW2_ZERO_ALLOC,    /* reads as zero, host cluster kept */
    QCOW2_NORMAL,        /* data at a host offset */
    QCOW2_COMPRESSED,
} Qcow2Type;

/* A run of guest bytes with one kind of mapping (host-contiguous for NORMAL). */
typedef struct Qcow2Extent {
    Qcow2Type type;
    uint64_t host;       /* host offset of the first byte (NORMAL, ZERO_ALLOC) */
    uint64_t l2e;        /* raw L2 entry (COMPRESSED) */
    uint64_t bytes;
    bool copied;         /* NORMAL: refcount is exactly 1, writable in place */
} Qcow2Extent;

/* What a request in flight does, for the dependency rules in deps.c. */
typedef enum Qcow2ReqKind {
    QCOW2_REQ_PLAIN,     /* reads, and writes into allocated subclusters */
    QCOW2_REQ_ALLOC,     /* an allocating write (new cluster or new subclusters) */
    QCOW2_REQ_EXCL,      /* zero writes, discard: wait for and block all overlaps */
} Qcow2ReqKind;

/* A request in flight. For ALLOC, [start, end) is the whole clusters and
 * the footprint/COW areas say which guest bytes it writes to the host
 * and which of those are copies of old data (empty ranges when start ==
 * end). */
typedef struct Qcow2Req {
    uint64_t start, end;
    Qcow2ReqKind kind;
    bool fresh;                  /* ALLOC: host cluster not in L2 yet */
    uint64_t foot_start, foot_end;
    uint64_t cow_start[2], cow_end[2];
    QkCoQueue waiters;
    struct Qcow2Req *prev, *next;
} Qcow2Req;

/* One slot of the clean-host table (deps.c): a host cluster this session
 * took from never-used file space, and the subclusters of it that some
 * write may have put data into. Others still read as zeros on the host. */
typedef struct Qcow2CleanSlot {
    uint64_t cluster_plus1;      /* host cluster index + 1; 0 = empty */
    uint32_t dirty;
} Qcow2CleanSlot;

typedef struct Qcow2Ext {
    uint32_t type;
    uint32_t len;
    uint8_t *data;
    struct Qcow2Ext *next;
} Qcow2Ext;

/* One bitmap directory entry, as stored (bitmap_dir.c). */
#define QCOW2_BME_IN_USE 1u
#define QCOW2_BME_AUTO 2u
#define QCOW2_BME_EXTRA_COMPAT 4u
typedef struct Qcow2BmEntry {
    uint64_t table_off;
    uint32_t table_size;        /* entries */
    uint32_t flags;
    uint8_t type, gbits;
    uint32_t extra_len;
    uint8_t *extra;
    char *name;
    /* An entry the format forbids or past the end of the file when the
     * image was opened: the file may have grown over that cluster since,
     * so removing the bitmap frees none of its data clusters. */
    bool broken;
} Qcow2BmEntry;
typedef struct Qcow2BmDir {
    Qcow2BmEntry *e;
    uint32_t n;
    uint64_t off, size;         /* where it is on disk (0, 0: no directory) */
} Qcow2BmDir;

struct Qcow2State {
    QkBlock *bs;
    Qcow2Header h;
    bool read_only;
    /* Where guest data lives: bs->file, or the external data file
     * (data_file.c), whose clusters sit at their guest offsets and are not
     * counted in the refcounts. */
    QkBlock *data;
    char *data_file_name;       /* as the header extension names it */
    bool data_raw;              /* the data file is kept a valid raw image */
    /* How the image is encrypted (crypto_info.c), for info: set only by a
     * metadata-only open, which keeps guest data out (no_guest_data). */
    QkEncryptInfo *encrypt;
    /* Zero writes under way with QK_REQ_BACKING_PENDING: while any is,
     * every zero write acts as if a backing file were below (the safe
     * side for the others: zeros recorded that need not be). */
    unsigned backing_pending;

    uint32_t cluster_bits;
    uint64_t cluster_size;
    bool extended_l2;
    uint32_t l2_entry_size;     /* 8, or 16 with extended L2 */
    uint32_t l2_bits;           /* log2 of entries per L2 table */
    uint64_t l2_entries;
    uint32_t sc_bits;           /* log2 of the mapping unit: subcluster or cluster */
    uint64_t sc_size;
    uint32_t sc_per_cluster;    /* 32 with extended L2, else 1 */

    uint32_t refcount_order;
    uint32_t refcount_bits;
    uint64_t refcount_max;
    uint32_t rb_bits;           /* log2 of refcount entries per block */

    uint64_t *l1;               /* host order */
    uint32_t l1_size;
    uint64_t l1_offset;
    bool l1_dirty;              /* a rewrite of the active L1 failed; flush retries it */
    bool copied_stale;          /* COPIED flags not yet recomputed after refcounts fell (a
                                   failed write stopped it): safe, only more copying */

    uint64_t *rt;               /* refcount table, host order */
    uint64_t rt_size;           /* entries in memory */
    uint64_t rt_offset;
    uint32_t rt_clusters;
    uint64_t rt_disk_size;      /* entries of the table on disk at rt_offset */

    Qcow2Ext *exts;             /* every header extension, as read */
    QkBitmapInfo *bitmaps;      /* the bitmap directory, for info (bitmap_dir.c) */
    int nb_bitmaps;
    bool bitmaps_stale;         /* a bitmaps extension whose autoclear bit is clear */
    char *bitmaps_problem;      /* why the stored bitmaps cannot be used, or NULL (bitmap_dir.c) */
    Qcow2BmDir bm_disk;         /* the directory as loaded by a read-write open (bitmaps.c) */
    bool bm_live;               /* the node's persistent bitmaps are stored on close */
    uint32_t *bm_disk_flags;    /* each stored entry's flags as on disk now (in use or not) */
    QkCoMutex bm_lock;          /* one change of the stored directory at a time */
    uint8_t *feature_table;     /* raw feature name table, or NULL */
    uint32_t feature_table_len;

    Qcow2Cache *l2_cache;
    Qcow2Cache *rb_cache;
    QkCoMutex lock;             /* metadata changes */

    uint64_t free_hint;         /* lowest cluster index that may be free */
    uint64_t reserved_start, reserved_end;  /* clusters the free search skips */
    uint64_t host_end;          /* end of the highest cluster ever allocated */
    uint64_t file_size;         /* host file size as we last set or saw it */
    bool file_grown;            /* we extended the file ahead of use */
    uint64_t written_end;       /* O_DIRECT: the file holds written blocks (or existed) below this */
    QkCoMutex grow_lock;        /* one file extension at a time */

    bool lazy_refcounts;
    bool dirty_set_by_us;
    bool strict_alloc_deps;

    Qcow2Req *reqs;             /* in flight: allocating, zero and discard (deps.c) */
    Qcow2Req *plain_reqs;       /* in flight: the plain ones */
    uint8_t *zero_buf;          /* one cluster of zeros, shared */
    Qcow2CleanSlot *clean;      /* clean-host table (deps.c), lazily made */
    uint64_t comp_next;         /* compress.c: next free byte of the host cluster being
                                   filled with compressed clusters (0: none); reset when
                                   that cluster's refcount falls to zero */
    int compress_level;         /* 0: the type's default (zlib 6, zstd 3) */
    void *cow_pool[4];          /* spare copy-on-write buffers (write.c) */
    unsigned cow_pool_n;

    /* overlap.c: the metadata clusters, sorted, as of meta_built_gen */
    struct MetaCluster *meta_list;  /* NULL: none yet (or out of memory) */
    size_t meta_n;
    uint64_t meta_gen, meta_built_gen;
    unsigned meta_checks;
    bool l1_past_eof;           /* a read-only check or info opened an L1 table past EOF (zeros there) */
    bool meta_corrupt;          /* found corrupt (qcow2_signal_corruption): no more writes */
    char meta_corrupt_msg[160];
    bool nonfatal_said;         /* qcow2_note_corruption spoke once: it stays quiet */
    /* overlap.c: the snapshot table and the snapshots' L1 tables (byte
     * ranges), as of the open or the last table written */
    uint64_t snap_table_off, snap_table_len;
    uint64_t (*snap_l1)[2];     /* offset, length */
    uint32_t snap_l1_n;
    /* Snapshots' L1 tables named past the end of the file at open, as
     * sorted disjoint cluster ranges [first, last]: kept out of meta_list,
     * whose size the file's length bounds, but no less protected. */
    uint64_t (*snap_far)[2];
    uint32_t snap_far_n;
};

/* overlap.c: the kinds of metadata a write must not overlap. */
enum {
    QCOW2_OL_HEADER = 1u << 0,
    QCOW2_OL_L1 = 1u << 1,
    QCOW2_OL_L2 = 1u << 2,
    QCOW2_OL_REFT = 1u << 3,
    QCOW2_OL_REFB = 1u << 4,
    QCOW2_OL_BITMAP_DIR = 1u << 5,
    QCOW2_OL_SNAPSHOT_TABLE = 1u << 6,
    QCOW2_OL_INACTIVE_L1 = 1u << 7,
};
/* The kind of live metadata (other than IGNORE's) in [off, off+len) of
 * the image file, or 0. */
unsigned qcow2_meta_overlap(Qcow2State *s, uint64_t off, uint64_t len, unsigned ignore);
/* The end of the last cluster of live metadata, in *end; -QK_ECORRUPT
 * when one of them has refcount 0 (the refcounts are wrong, and so is
 * anything they say about which clusters are free). */
int coroutine_fn qcow2_meta_floor(Qcow2State *s, uint64_t *end);
/* 0, or -EIO for a write of guest data over metadata (or any after one):
 * the image is then to be marked corrupt. */
int qcow2_check_data_write(Qcow2State *s, uint64_t off, uint64_t len);
/* The snapshot table at off (len bytes) holds sn[0..n): what the check
 * protects from now on (len = 0: no table; n = 0 with a length: a table
 * that could not be read, protected over the length it claims). */
struct Qcow2Snapshot;
void qcow2_meta_set_snapshots(Qcow2State *s, const struct Qcow2Snapshot *sn, uint32_t n, uint64_t off,
                              uint64_t len);
/* A guest cluster about to be freed (its L2 entry dropped) that holds
 * live metadata: only a corrupt L2 entry names one, and freeing it would
 * let the table be handed out again. -EIO, and the image is marked
 * corrupt. */
int qcow2_check_data_free(Qcow2State *s, uint64_t off, uint64_t len);
/* The same as qcow2_check_data_write for a table of KIND written back at
 * its place. */
int qcow2_check_table_write(Qcow2State *s, uint64_t off, uint64_t len, unsigned kind);
/* Writes metadata (or a bitmap's data) at off after the same check,
 * ignoring the metadata kinds in ignore (what is rewritten in place). */
int coroutine_fn qcow2_co_write_new_meta(Qcow2State *s, uint64_t off, uint64_t len, const void *buf,
                                         unsigned ignore, int flags);
/* Sets the header's corrupt bit after a refused write (s->lock held). */
int coroutine_fn qcow2_mark_corrupt_if_needed(Qcow2State *s);
/* Records that the image is corrupt (the first reason only; QEMU's words,
 * without the "qcow2: Marking image as corrupt: " prefix), tells the
 * corrupt hook, and returns -EIO: from then on the image takes no writes,
 * and a writable one gets the header's corrupt bit at its next flush. */
int qcow2_signal_corruption(Qcow2State *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Damage the request can step around (a cluster that cannot be freed
 * is leaked instead): said once, in QEMU's non-fatal words, and the
 * image stays writable and unmarked. */
void qcow2_note_corruption(Qcow2State *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A header write that switches to new metadata (or the flush that makes
 * it durable) failed: the disk may name the old structures or the new
 * ones. Both were intact when the write began, so the image is fenced
 * (block.h): no write of this process may change either. Returns R. */
int qcow2_fence(Qcow2State *s, int r);
/* Says the L1 table, the refcount table or the bitmap directory changed
 * (a table added, moved or dropped). */
void qcow2_meta_changed(Qcow2State *s);
/* Says one table of KIND was added at OFF (a new L2 table or refcount
 * block): cheaper than qcow2_meta_changed. */
void qcow2_meta_added(Qcow2State *s, uint64_t off, unsigned kind);

static inline Qcow2State *qcow2_state(QkBlock *bs) { return bs->opaque; }
static inline uint64_t qcow2_offset_into_cluster(const Qcow2State *s, uint64_t off) { return off & (s->cluster_size - 1); }
static inline uint64_t qcow2_cluster_index(const Qcow2State *s, uint64_t off) { return off >> s->cluster_bits; }
static inline bool qcow2_is_v3(const Qcow2State *s) { return s->h.version >= 3; }
/* s->data is NULL only when a metadata-only open left a missing data file
 * out: the layout is still the data file's. */
static inline bool qcow2_has_data_file(const Qcow2State *s)
{
    return s->data ? s->data != s->bs->file : s->bs->no_guest_data;
}

/* Whether a standard (not compressed) L2 entry maps a host cluster: an
 * offset, or guest cluster 0 of an image with a data file, which sits at
 * offset 0 there and is told from nothing by OFLAG_COPIED (every
 * data-file cluster has it). */
static inline bool qcow2_l2e_mapped(const Qcow2State *s, uint64_t e)
{
    return (e & QCOW2_L2E_OFFSET_MASK) || (qcow2_has_data_file(s) && (e & QCOW2_OFLAG_COPIED));
}

/* data_file.c: opens the external data file the header names (as given:
 * a relative name is relative to the current directory) with the image's
 * own flags; flushes it (before the metadata that points into it);
 * closes it. */
int coroutine_fn qcow2_data_file_open(Qcow2State *s, const QkOpenOptions *opts, QkError *err);

/* crypto_info.c */
int coroutine_fn qcow2_crypto_info_load(Qcow2State *s, uint64_t file_len, QkError *err);
/* Whether paths A and B name one file, existing or still to be made: a
 * data file must never be the image itself. */
bool qcow2_same_file(const char *a, const char *b);
int coroutine_fn qcow2_data_file_flush(Qcow2State *s);
int coroutine_fn qcow2_data_file_close(Qcow2State *s);
/* amend: names another data file (NULL keeps the name, "" drops it, as
 * qemu-img does) and/or clears the raw bit; rewrites the header. */
int coroutine_fn qcow2_data_file_amend(QkBlock *bs, const char *name, bool clear_raw, QkError *err);

/* bitmaps.c: what the specification allows in a bitmap table entry: no
 * reserved bits, and with an offset, a cluster-aligned one without the
 * all-ones flag. */
bool qcow2_bitmap_entry_ok(uint64_t te, uint64_t cs);

/* header.c */
int qcow2_read_header(QkBlock *file, Qcow2Header *h, uint8_t **cluster0, uint64_t *file_len, QkError *err);
int qcow2_validate_header(Qcow2State *s, uint64_t file_len, bool rdwr, bool l1_may_be_lost, bool metadata_only,
                          QkError *err);
int qcow2_parse_extensions(Qcow2State *s, const uint8_t *cluster0, char **backing_fmt, QkError *err);
void qcow2_free_extensions(Qcow2State *s);
/* Reads the directory the bitmaps extension names (n = 0 when there is
 * none); -QK_ECORRUPT when it breaks the layout rules or QEMU's bounds,
 * with *why set to QEMU's message where QEMU has one (else NULL). */
int coroutine_fn qcow2_bitmap_dir_read(Qcow2State *s, Qcow2BmDir *d, const char **why);
void qcow2_bitmap_dir_free(Qcow2BmDir *d);
/* 1 and *dup set when two entries share a name, 0 when none do, -ENOMEM. */
int qcow2_bitmap_dir_dup_name(const Qcow2BmDir *d, const char **dup);
uint64_t qcow2_bitmap_entry_len(const Qcow2BmEntry *e);
/* Writes n entries into buf (the sum of their lengths, zero padded). */
void qcow2_bitmap_dir_layout(const Qcow2BmEntry *e, uint32_t n, uint8_t *buf);
/* bitmaps.c: on a read-write open, the directory's bitmaps become the
 * node's persistent dirty bitmaps (enabled ones tracking writes, marked
 * in use on disk first); -ENOTSUP with a message for bitmaps that cannot
 * be kept up to date. On close (or when asked) they are stored again. */
int coroutine_fn qcow2_bitmaps_open(QkBlock *bs, QkError *err);
int coroutine_fn qcow2_bitmaps_store(QkBlock *bs, QkError *err);
int qcow2_bitmap_can_store(QkBlock *bs, const char *name, uint64_t granularity, QkError *err);
int qcow2_bitmap_check_entry(Qcow2State *s, const Qcow2BmEntry *e, bool rw, QkError *err);
int coroutine_fn qcow2_bitmap_remove_stored(QkBlock *bs, struct QkDirtyBitmap *bm, QkError *err);
/* Before the virtual size changes to new_size: refuses when a stored
 * bitmap is in use (out of date), or when the new size is 0 and the image
 * has persistent bitmaps (none can describe an empty disk); else marks
 * every stored one in use, durably, until the store at close writes it at
 * the new size. */
int coroutine_fn qcow2_bitmaps_begin_resize(Qcow2State *s, uint64_t new_size, QkError *err);
/* Before a stored bitmap starts to differ from its copy on disk (enabled,
 * cleared, merged into while the image is open): marks it in use there. */
int coroutine_fn qcow2_bitmap_begin_change(QkBlock *bs, struct QkDirtyBitmap *bm, QkError *err);
void qcow2_bitmaps_forget(Qcow2State *s);
/* bitmap_dir.c: reads the bitmap directory's names, granularities and
 * flags into s->bitmaps (nothing when the autoclear bit says the bitmaps
 * are not valid); -QK_ECORRUPT on a malformed directory. */
int coroutine_fn qcow2_bitmaps_load_list(Qcow2State *s);
void qcow2_bitmaps_free_list(Qcow2State *s);
int coroutine_fn qcow2_write_header_field(Qcow2State *s, unsigned off, unsigned len);
int coroutine_fn qcow2_set_incompat(Qcow2State *s, uint64_t incompat);
/* Records name (NULL: none) and fmt as the backing file in cluster 0,
 * keeping every other extension; flushed before it returns. The open
 * chain (bs->backing) is not switched. */
int coroutine_fn qcow2_co_change_backing(QkBlock *bs, const char *name, const char *fmt, QkError *err);
/* Rewrites the header with nh's fields and version (amend's compat
 * change): the extensions are re-laid for that version, the backing file
 * kept; one write of cluster 0, flushed. */
int coroutine_fn qcow2_co_rewrite_header(QkBlock *bs, const Qcow2Header *nh, QkError *err);
/* amend.c */
int coroutine_fn qcow2_co_amend(QkBlock *bs, const QkAmendOptions *o, QkError *err);
/* Serialises a fresh header cluster for create. */
int qcow2_build_header(const Qcow2Header *h, const char *backing, const char *backing_fmt, const char *data_file,
                       uint8_t *buf, size_t buflen, QkError *err);
void qcow2_header_to_be(const Qcow2Header *h, uint8_t *buf);

/* cache.c */
Qcow2Cache *qcow2_cache_new(Qcow2State *s, unsigned entries);
/* Memory the cache's tables take (fixed when it is created). */
size_t qcow2_cache_bytes(const Qcow2Cache *c);
void qcow2_cache_free(Qcow2Cache *c);
void qcow2_cache_set_dependency(Qcow2Cache *c, Qcow2Cache *dep);
/* From now on c's tables are written only after dep's dirty tables (and,
 * with barrier, after every write already made to the file). If dep
 * depended on c, c's tables are written out first to end that. */
int coroutine_fn qcow2_cache_depend(Qcow2Cache *c, Qcow2Cache *dep, bool barrier);
/* The next write of a table of c first flushes the file: the writes made
 * to it so far (data a changed L2 entry now exposes) come first. */
void qcow2_cache_barrier(Qcow2Cache *c);
/* Ends c's dependency, writing out what c was waiting for. */
int coroutine_fn qcow2_cache_release(Qcow2Cache *c);
int coroutine_fn qcow2_cache_get(Qcow2Cache *c, uint64_t offset, void **table);
int coroutine_fn qcow2_cache_get_empty(Qcow2Cache *c, uint64_t offset, void **table);
void qcow2_cache_put(Qcow2Cache *c, void **table);
void qcow2_cache_mark_dirty(Qcow2Cache *c, void *table);
int coroutine_fn qcow2_cache_write_one(Qcow2Cache *c, void *table);
int coroutine_fn qcow2_cache_flush(Qcow2Cache *c);
bool qcow2_cache_has_dirty(const Qcow2Cache *c);
/* Forgets a table whose cluster was freed (dirty contents are dropped). */
void qcow2_cache_discard(Qcow2Cache *c, uint64_t offset);

/* refcount.c */
int coroutine_fn qcow2_get_refcount(Qcow2State *s, uint64_t cluster, uint64_t *rc);
int coroutine_fn qcow2_update_refcount(Qcow2State *s, uint64_t off, uint64_t len, int64_t addend);
/* Allocates n contiguous clusters (refcount 1); returns the host offset or -errno. */
int64_t coroutine_fn qcow2_alloc_clusters(Qcow2State *s, uint64_t n);
/* The same for a caller that writes the new clusters at once with
 * requests of at least QCOW2_BULK_WRITE bytes: under O_DIRECT the file
 * then grows sparsely instead of by writing zeros first. */
#define QCOW2_BULK_WRITE (1u << 20)
int64_t coroutine_fn qcow2_alloc_clusters_bulk(Qcow2State *s, uint64_t n);
int coroutine_fn qcow2_free_clusters(Qcow2State *s, uint64_t off, uint64_t len);
/* Drops the reference an L2 entry holds (normal, zero-allocated or compressed). */
int coroutine_fn qcow2_free_l2_entry(Qcow2State *s, uint64_t l2e);
/* 0, or -EIO (the image then marked corrupt) when l2e's host cluster
 * must not be freed: it is metadata. Checked before an entry is changed,
 * so a refused free leaves the table as it was. An offset inside a
 * cluster (freeing it would drop the refcounts of two clusters, one of
 * them someone else's) is said and then leaked by qcow2_free_l2_entry. */
int qcow2_check_free_l2_entry(Qcow2State *s, uint64_t l2e);
uint64_t qcow2_rb_get(const Qcow2State *s, const void *block, uint64_t i);
void qcow2_rb_set(const Qcow2State *s, void *block, uint64_t i, uint64_t v);
int coroutine_fn qcow2_write_rt_entry(Qcow2State *s, uint64_t ti);
/* Unhooks refcount blocks that count nothing but themselves (after a
 * shrink), so the file can end before them. */
int coroutine_fn qcow2_drop_empty_refblocks(Qcow2State *s);
/* Makes sure the host file reaches end (grows it ahead in big steps). */
int coroutine_fn qcow2_ensure_file_size(Qcow2State *s, uint64_t end);

/* map.c */
/* What [off, off+max_bytes) maps to, up to where that changes (ext->bytes).
 * An L2 entry no reader can follow is corruption (-EIO, said once in
 * QEMU's words). */
int coroutine_fn qcow2_get_extent(Qcow2State *s, uint64_t off, uint64_t max_bytes, Qcow2Extent *ext);
/* The same for a range about to be written, as QEMU's write path judges
 * it: a version 2 zero flag is then taken as a zero cluster (a write over
 * the whole cluster replaces it; a partial one fails when its copy-on-write
 * reads the rest), and corruption is worded as QEMU's write path words it. */
int coroutine_fn qcow2_get_extent_for_write(Qcow2State *s, uint64_t off, uint64_t max_bytes, Qcow2Extent *ext);
/* An L2 table (L1 entry l1i) or a data cluster (entry i of the L2 table
 * at l2off) that does not start where a cluster does: the image is found
 * corrupt, in QEMU's words (qcow2_signal_corruption; returns -EIO). */
int qcow2_bad_l2_offset(Qcow2State *s, uint64_t l2off, uint64_t l1i);
int qcow2_bad_data_offset(Qcow2State *s, uint64_t host, uint64_t l2off, uint64_t i);
/* Pins the L2 table for l1_index ready for update (allocating or copying it). */
int coroutine_fn qcow2_get_l2_for_write(Qcow2State *s, uint64_t l1_index, void **table);
uint64_t qcow2_l2_get(const Qcow2State *s, const void *table, uint64_t i, uint64_t *bitmap);
void qcow2_l2_set(const Qcow2State *s, void *table, uint64_t i, uint64_t e, uint64_t bitmap);
int coroutine_fn qcow2_write_l1_entry(Qcow2State *s, uint64_t i);
int coroutine_fn qcow2_grow_l1(Qcow2State *s, uint64_t min_size, QkError *err);
uint64_t qcow2_l1_needed(const Qcow2State *s, uint64_t size);
void qcow2_compressed_range(const Qcow2State *s, uint64_t l2e, uint64_t *host, uint64_t *len);

/* zero.c: clusters of [start, end) (cluster aligned) become unallocated,
 * their host clusters freed: nothing of them shows, not even a backing
 * file. For cutting off what lies past a new end of the image. */
int coroutine_fn qcow2_unmap_clusters(Qcow2State *s, uint64_t start, uint64_t end);

/* resize.c */
int coroutine_fn qcow2_co_truncate(QkBlock *bs, uint64_t size, QkPrealloc prealloc, QkError *err);
int coroutine_fn qcow2_co_make_empty(QkBlock *bs);

/* deps.c: requests in flight and the dependencies between them */
/* Registers a read or plain write (exclusive = false) or a zero write or
 * discard (exclusive = true), after waiting for what it conflicts with. */
void coroutine_fn qcow2_req_begin(Qcow2State *s, Qcow2Req *r, uint64_t start, uint64_t end, bool exclusive);
/* First request in flight that r must wait for, or NULL. */
Qcow2Req *qcow2_req_conflict(Qcow2State *s, const Qcow2Req *r);
/* Registers r without waiting (the caller checked qcow2_req_conflict). */
void qcow2_req_insert(Qcow2State *s, Qcow2Req *r);
void qcow2_req_end(Qcow2State *s, Qcow2Req *r);
int coroutine_fn qcow2_mark_dirty(Qcow2State *s);
/* Clean-host table: host subclusters known to read as zeros on the host. */
void qcow2_clean_add(Qcow2State *s, uint64_t host);
void qcow2_clean_forget(Qcow2State *s, uint64_t host);
void qcow2_clean_mark(Qcow2State *s, uint64_t host, uint32_t sc_mask);
bool qcow2_clean_is_zero(const Qcow2State *s, uint64_t host, unsigned sc);
void qcow2_deps_free(Qcow2State *s);

/* read.c */
int coroutine_fn qcow2_read_unlocked(Qcow2State *s, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                     int flags);
int coroutine_fn qcow2_co_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff, int flags);

/* write.c */
void qcow2_write_free(Qcow2State *s);
int coroutine_fn qcow2_co_pwritev(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff, int flags);
/* compress.c */
int coroutine_fn qcow2_co_pwritev_compressed(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov,
                                             size_t qoff);
/* Compresses one cluster with compression type 0 (zlib) or 1 (zstd) at
 * level (0: default) into out; the compressed length, or 0 when it does
 * not fit in cap bytes. Thread-safe. */
size_t qcow2_compress_cluster(int type, int level, const uint8_t *in, size_t len, uint8_t *out, size_t cap);

/* zero.c */
int coroutine_fn qcow2_co_pwrite_zeroes(QkBlock *bs, uint64_t off, uint64_t bytes, int flags);
int coroutine_fn qcow2_co_pdiscard(QkBlock *bs, uint64_t off, uint64_t bytes);

/* create.c */
int coroutine_fn qcow2_co_create(const char *filename, const QkCreateOptions *opts, QkError *err);
int coroutine_fn qcow2_preallocate(Qcow2State *s, uint64_t from, uint64_t to, QkPrealloc mode, QkError *err);

/* qcow2.c */
int coroutine_fn qcow2_flush_caches(Qcow2State *s);

/* Big-endian helpers. */

#endif
