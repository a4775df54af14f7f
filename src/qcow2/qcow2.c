/*
 * The qcow2 format driver: open (validate everything, then load L1 and the
 * refcount table), close, flush, block status, truncate, image info, and
 * the driver table. The data paths live in read.c, write.c and zero.c.
 */
#include "qcow2/qcow2_int.h"
#include "qcow2/snapshot_int.h"
#include "block/dirty_bitmap.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_L2_CACHE_MAX (32ULL << 20)
#define MIN_L2_CACHE 2u
#define MIN_RB_CACHE 4u

/* Version 1 is QCOW's first format, which this driver claims only to
 * refuse it: probed as raw, a write would have changed the image under
 * its own metadata. (Version 0 is no QCOW: raw, as QEMU probes it.) */
static int qcow2_probe(const uint8_t *buf, size_t len)
{
    return len >= 8 && memcmp(buf, "QFI\xfb", 4) == 0 && qk_be32_get(buf + 4) >= 1 ? 100 : 0;
}

bool qk_block_is_qcow2(const QkBlock *bs)
{
    return bs && bs->drv == &qk_drv_qcow2;
}

const char *qk_block_corrupt_reason(const QkBlock *bs)
{
    if (!qk_block_is_qcow2(bs)) {
        return NULL;
    }
    const Qcow2State *s = bs->opaque;
    return s->meta_corrupt ? s->meta_corrupt_msg : NULL;
}

const char *qk_block_bitmaps_problem(const QkBlock *bs)
{
    if (!qk_block_is_qcow2(bs)) {
        return NULL;
    }
    const Qcow2State *s = bs->opaque;
    return s->bitmaps_problem;
}

/* Process-wide, as the tools set it once at start-up; reading it from
 * any thread after that is safe. */
static QkCorruptHook *corrupt_hook;

void qk_block_set_corrupt_hook(QkCorruptHook *fn)
{
    corrupt_hook = fn;
}

int qcow2_signal_corruption(Qcow2State *s, const char *fmt, ...)
{
    if (s->meta_corrupt) {
        return -EIO; /* the first reason is the one kept and said */
    }
    s->meta_corrupt = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->meta_corrupt_msg, sizeof(s->meta_corrupt_msg), fmt, ap);
    va_end(ap);
    if (corrupt_hook) {
        corrupt_hook(s->bs, !s->read_only, s->meta_corrupt_msg);
    }
    return -EIO;
}

int qcow2_fence(Qcow2State *s, int r)
{
    s->bs->fenced = true;
    s->bs->file->fenced = true;
    return r;
}

void qcow2_note_corruption(Qcow2State *s, const char *fmt, ...)
{
    if (s->meta_corrupt || s->nonfatal_said) {
        return;
    }
    s->nonfatal_said = true;
    char msg[sizeof(s->meta_corrupt_msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (corrupt_hook) {
        corrupt_hook(s->bs, false, msg);
    }
}

static int coroutine_fn load_table(Qcow2State *s, uint64_t off, uint64_t entries, uint64_t alloc_entries,
                                   uint64_t **out)
{
    uint64_t *t = calloc(QK_MAX(alloc_entries, 1), 8);
    if (!t) {
        return -ENOMEM;
    }
    if (entries) {
        int r = qk_co_pread(s->bs->file, off, entries * 8, t, 0);
        if (r < 0) {
            free(t);
            return r;
        }
        for (uint64_t i = 0; i < entries; i++) {
            t[i] = be64toh(t[i]);
        }
    }
    *out = t;
    return 0;
}

static void free_state(Qcow2State *s)
{
    qcow2_cache_free(s->l2_cache);
    qcow2_cache_free(s->rb_cache);
    s->l2_cache = s->rb_cache = NULL;
    free(s->l1);
    free(s->rt);
    free(s->bitmaps_problem);
    free(s->zero_buf);
    qcow2_write_free(s);
    s->l1 = s->rt = NULL;
    s->zero_buf = NULL;
    free(s->meta_list);
    s->meta_list = NULL;
    free(s->snap_l1);
    s->snap_l1 = NULL;
    free(s->snap_far);
    s->snap_far = NULL;
    s->snap_far_n = 0;
    s->snap_l1_n = 0;
    qcow2_bitmaps_free_list(s);
    qcow2_bitmaps_forget(s);
    qcow2_data_file_close(s);
    qcow2_free_extensions(s);
    free(s->encrypt);
    s->encrypt = NULL;
}

int coroutine_fn qcow2_flush_caches(Qcow2State *s)
{
    bool rb_dirty = qcow2_cache_has_dirty(s->rb_cache);
    int r = qcow2_cache_flush(s->rb_cache);
    if (r == 0 && rb_dirty && (qcow2_cache_has_dirty(s->l2_cache) || s->l1_dirty) && !s->lazy_refcounts) {
        r = qk_co_flush(s->bs->file);
    }
    if (r == 0) {
        r = qcow2_cache_flush(s->l2_cache);
    }
    if (r == 0 && s->l1_dirty) {
        r = qcow2_rewrite_active_l1(s);
    }
    return r;
}

/* Rebuilds refcounts left stale by a crash with lazy refcounts on. */
/* Before a read-write open: a refcount block the table places past the
 * end of the file would fail the first allocation that needs it, after
 * the open had already marked the bitmaps in use, or half way through a
 * command (qemu-img reads it as zeros and goes on, handing out clusters
 * in use). Refused up front instead; a dirty image is repaired first,
 * and check -r all rebuilds the structure. An unaligned block is left
 * to its first use, which marks the image corrupt as QEMU does. */
static int check_refcount_table(Qcow2State *s, uint64_t flen, QkError *err)
{
    for (uint64_t i = 0; i < s->rt_size; i++) {
        uint64_t off = s->rt[i] & QCOW2_REFT_OFFSET_MASK;
        if (off && qk_is_aligned(off, s->cluster_size) && !qk_range_within(off, s->cluster_size, flen)) {
            return qk_error_corrupt(err, "refcount table entry %" PRIu64 " is invalid (%#" PRIx64 "): the refcount "
                                    "block lies past the end of the file; the image can be opened read-only "
                                    "('check -r all' repairs it)", i, s->rt[i]);
        }
    }
    return 0;
}

static int coroutine_fn repair_dirty(QkBlock *bs, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    QkCheckResult res;
    int r = qk_qcow2_co_check(bs, QK_CHECK_FIX_LEAKS | QK_CHECK_FIX_ERRORS, &res, NULL, NULL, err);
    if (r < 0) {
        return r;
    }
    if (res.corruptions || res.check_errors) {
        return qk_error_corrupt(err, "could not repair the refcounts of a dirty image");
    }
    r = qk_co_flush(bs->file);
    if (r == 0) {
        r = qcow2_set_incompat(s, s->h.incompatible_features & ~QCOW2_INCOMPAT_DIRTY);
    }
    if (r == 0) {
        r = qk_co_flush(bs->file);
    }
    return r < 0 ? qk_error_set_errno(err, r, "Could not clear the dirty bit") : 0;
}

static int coroutine_fn qcow2_open(QkBlock *bs, const QkOpenOptions *opts, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    memset(s, 0, sizeof(*s));
    s->bs = bs;
    s->read_only = bs->read_only;
    s->strict_alloc_deps = opts->strict_alloc_deps;
    s->compress_level = opts->compress_level;
    qk_co_mutex_init(&s->lock);
    qk_co_mutex_init(&s->grow_lock);
    qk_co_mutex_init(&s->bm_lock);

    uint8_t *c0 = NULL;
    uint64_t flen;
    char *bfmt = NULL;
    int r = qcow2_read_header(bs->file, &s->h, &c0, &flen, err);
    if (r < 0) {
        return r;
    }
    s->cluster_bits = s->h.cluster_bits;
    s->cluster_size = 1ULL << s->cluster_bits;
    r = qcow2_parse_extensions(s, c0, &bfmt, err);
    if (r == 0) {
        r = qcow2_validate_header(s, flen, !bs->read_only && !(opts->flags & QK_OPEN_CHECK),
                                  bs->read_only && (opts->flags & (QK_OPEN_CHECK | QK_OPEN_METADATA_ONLY)),
                                  bs->read_only && (opts->flags & QK_OPEN_METADATA_ONLY), err);
    }
    if (r == 0 && s->h.crypt_method) {
        /* Described, never decrypted: no guest data goes through. */
        r = qcow2_crypto_info_load(s, flen, err);
        bs->no_guest_data = true;
    }
    if (r == 0) {
        r = qcow2_data_file_open(s, opts, err);
    }
    if (r < 0) {
        goto fail;
    }
    if (s->h.backing_file_offset) {
        bs->backing_file = strndup((const char *)c0 + s->h.backing_file_offset, s->h.backing_file_size);
        bs->backing_format = bfmt;
        bfmt = NULL;
    }
    free(bfmt);
    bfmt = NULL;

    s->l1_size = s->h.l1_size;
    s->l1_offset = s->h.l1_table_offset;
    uint64_t l1_in_file = s->l1_size;
    if (s->l1_past_eof) {
        l1_in_file = s->l1_offset < flen ? QK_MIN(s->l1_size, (flen - s->l1_offset) / 8) : 0;
    }
    r = load_table(s, s->l1_offset, l1_in_file, s->l1_size, &s->l1);
    if (r < 0) {
        qk_error_set_errno(err, r, "Could not read the L1 table");
        goto fail;
    }
    s->rt_offset = s->h.refcount_table_offset;
    s->rt_clusters = s->h.refcount_table_clusters;
    s->rt_size = ((uint64_t)s->rt_clusters << s->cluster_bits) / 8;
    s->rt_disk_size = s->rt_size;
    r = load_table(s, s->rt_offset, s->rt_size, s->rt_size, &s->rt);
    if (r < 0) {
        qk_error_set_errno(err, r, "Could not read the refcount table");
        goto fail;
    }
    if (!bs->read_only && !(opts->flags & QK_OPEN_CHECK) && !(s->h.incompatible_features & QCOW2_INCOMPAT_DIRTY)) {
        r = check_refcount_table(s, flen, err);
        if (r < 0) {
            goto fail;
        }
    }

    uint64_t l2_entries, rb_entries;
    if (opts->cache_size) {
        /* A configured size is a bound: the tables never take more. A fifth
         * goes to refcount blocks, the rest to L2 tables, with qemu's
         * minimums (two L2 tables, four refcount blocks) so that a request
         * never waits for a table only it could release. */
        uint64_t all = opts->cache_size / s->cluster_size;
        rb_entries = QK_MAX(all / 5, MIN_RB_CACHE);
        if (all < rb_entries + MIN_L2_CACHE) {
            r = qk_error_set(err, -EINVAL,
                             "cache-size must be at least %" PRIu64 " bytes for this image "
                             "(%u L2 tables and %u refcount blocks of %" PRIu64 " bytes)",
                             (uint64_t)(MIN_L2_CACHE + MIN_RB_CACHE) * s->cluster_size, MIN_L2_CACHE,
                             MIN_RB_CACHE, (uint64_t)s->cluster_size);
            goto fail;
        }
        /* Nor more refcount blocks than a fully allocated image (or the
         * file as it is, whichever is larger) can have: the cache is
         * allocated up front, so an absurd size must not become an
         * absurd allocation. */
        uint64_t host = (s->h.size >> s->cluster_bits) + qcow2_l1_needed(s, s->h.size) + s->rt_clusters;
        uint64_t rb_need = QK_MAX(host, (uint64_t)flen >> s->cluster_bits) >> s->rb_bits;
        rb_entries = QK_MAX(QK_MIN(rb_entries, rb_need + 2), MIN_RB_CACHE);
        l2_entries = QK_MIN(all - rb_entries, QK_MAX(qcow2_l1_needed(s, s->h.size), MIN_L2_CACHE));
    } else {
        l2_entries = QK_MIN(qcow2_l1_needed(s, s->h.size), DEFAULT_L2_CACHE_MAX / s->cluster_size);
        rb_entries = l2_entries / 4;
        l2_entries = QK_MAX(l2_entries, 16);
        rb_entries = QK_MAX(rb_entries, 8);
    }
    s->l2_cache = qcow2_cache_new(s, (unsigned)QK_MIN(l2_entries, 1u << 20));
    s->rb_cache = qcow2_cache_new(s, (unsigned)QK_MIN(rb_entries, 1u << 20));
    s->zero_buf = qk_aligned_zalloc(qk_block_buf_align(bs), s->cluster_size);
    if (!s->l2_cache || !s->rb_cache || !s->zero_buf) {
        r = qk_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if (!s->lazy_refcounts) {
        qcow2_cache_set_dependency(s->l2_cache, s->rb_cache);
    }
    /* Whole sectors, as QEMU sees the disk (a header size that is not a
     * multiple of 512 only comes from a damaged or hostile image). */
    bs->size = qk_align_down(s->h.size, 512);
    bs->request_alignment = 1;
    s->file_size = flen;
    s->host_end = flen;
    s->written_end = flen;
    s->free_hint = 1;

    /* The snapshots' tables, for the overlap check of a writer. One the
     * end of the file cuts short in its last cluster refuses a writer
     * (check -r aside): once the file grew over the lost part, that would
     * read as zeros, snapshots of nothing that no repair can tell from
     * real ones. */
    if (s->h.nb_snapshots && !bs->read_only && qcow2_snapshots_protect(s) && !(opts->flags & QK_OPEN_CHECK)) {
        r = qk_error_corrupt(err, "snapshot table (offset %#llx) is cut short by the end of the file; "
                             "'check -r all' can repair it", (unsigned long long)s->h.snapshots_offset);
        goto fail;
    }
    /* A malformed directory does not stop the open (the bitmaps are not
     * used for anything but info); check reports it. */
    if (qcow2_bitmaps_load_list(s) == -ENOMEM) {
        r = qk_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if (!bs->read_only && !(opts->flags & QK_OPEN_CHECK)) {
        /* check -r writes no guest data, so the bitmaps stay valid: it
         * keeps the autoclear bits, counts the bitmaps' clusters as in use
         * and leaves them alone. Everyone else repairs a dirty image
         * first, then takes the bitmaps over (bitmaps.c). */
        if (s->h.incompatible_features & QCOW2_INCOMPAT_DIRTY) {
            r = repair_dirty(bs, err);
            if (r < 0) {
                goto fail;
            }
        }
        r = qcow2_bitmaps_open(bs, err);
        if (r < 0) {
            goto fail;
        }
        uint64_t keep = (s->data_raw ? QCOW2_AUTOCLEAR_DATA_FILE_RAW : 0) |
                        (s->bm_live ? QCOW2_AUTOCLEAR_BITMAPS : 0);
        if (s->h.autoclear_features & ~keep) {
            /* We maintain none of the others: say so. */
            s->h.autoclear_features &= keep;
            if (!s->bm_live) {
                qcow2_bitmaps_free_list(s);
            }
            r = qcow2_write_header_field(s, QCOW2_HOFF_AUTOCLEAR, 8);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not update the qcow2 header");
                goto fail;
            }
        }
    } else if (opts->flags & QK_OPEN_LOAD_BITMAPS) {
        r = qcow2_bitmaps_open(bs, err);
        if (r < 0) {
            goto fail;
        }
    }
    free(c0);
    return 0;

fail:
    qk_dirty_bitmap_remove_all(bs); /* the loaded persistent ones */
    free(bfmt);
    free(c0);
    free(bs->backing_file);
    free(bs->backing_format);
    bs->backing_file = bs->backing_format = NULL;
    free_state(s);
    return r;
}

static int coroutine_fn qcow2_close(QkBlock *bs)
{
    Qcow2State *s = qcow2_state(bs);
    int r = 0, br = 0;
    if (!s->read_only) {
        /* Stored before the last flush, which makes them durable too. */
        QkError berr = {0};
        br = qcow2_bitmaps_store(bs, &berr);
        qk_co_mutex_lock(&s->lock);
        r = qcow2_data_file_flush(s);
        if (r == 0) {
            r = qcow2_flush_caches(s);
        }
        if (r == 0) {
            r = qcow2_fix_stale_copied(s);
        }
        int cr = qcow2_mark_corrupt_if_needed(s);
        if (r == 0) {
            r = cr;
        }
        if (r == 0 && s->dirty_set_by_us) {
            r = qk_co_flush(bs->file);
            if (r == 0) {
                r = qcow2_set_incompat(s, s->h.incompatible_features & ~QCOW2_INCOMPAT_DIRTY);
            }
        }
        if (r == 0 && s->file_grown && s->file_size > s->host_end) {
            /* Give back what we grew ahead but never used. Failing to is
             * harmless (the tail is unreferenced), so it is not reported. */
            QkError err = {0};
            qk_co_truncate(bs->file, s->host_end, QK_PREALLOC_OFF, &err);
        }
        int fr = qk_co_flush(bs->file);
        if (r == 0) {
            r = fr;
        }
        qk_co_mutex_unlock(&s->lock);
    }
    int dr = qcow2_data_file_close(s);
    free_state(s);
    return r < 0 ? r : br < 0 ? br : dr;
}

static int coroutine_fn qcow2_co_flush(QkBlock *bs)
{
    Qcow2State *s = qcow2_state(bs);
    qk_co_mutex_lock(&s->lock);
    /* Data first: the tables about to go out may point at it. */
    int r = qcow2_data_file_flush(s);
    if (r == 0) {
        r = qcow2_flush_caches(s);
    }
    int cr = qcow2_mark_corrupt_if_needed(s);
    qk_co_mutex_unlock(&s->lock);
    return r < 0 ? r : cr;
}

static int64_t qcow2_get_length(QkBlock *bs)
{
    return (int64_t)bs->size;
}

static int ext_flags(const QkBlock *bs, const Qcow2Extent *e)
{
    switch (e->type) {
    case QCOW2_UNALLOC: return (bs->backing ? 0 : QK_BS_ZERO) | (e->host ? QK_BS_OFFSET_VALID : 0);
    case QCOW2_ZERO_PLAIN: return QK_BS_ZERO | QK_BS_ALLOCATED;
    case QCOW2_ZERO_ALLOC: return QK_BS_ZERO | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
    case QCOW2_NORMAL: return QK_BS_DATA | QK_BS_ALLOCATED | QK_BS_OFFSET_VALID;
    default: return QK_BS_DATA | QK_BS_ALLOCATED;
    }
}

static int coroutine_fn qcow2_block_status(QkBlock *bs, uint64_t off, uint64_t bytes, uint64_t *pnum,
                                           uint64_t *map, QkBlock **file)
{
    Qcow2State *s = qcow2_state(bs);
    Qcow2Extent first;
    int r = qcow2_get_extent(s, off, bytes, &first);
    if (r < 0) {
        return r;
    }
    int flags = ext_flags(bs, &first);
    uint64_t n = first.bytes;
    /* Merge following extents of the same kind (host-contiguous for data). */
    while (n < bytes && first.type != QCOW2_COMPRESSED) {
        Qcow2Extent e;
        r = qcow2_get_extent(s, off + n, bytes - n, &e);
        if (r < 0 || ext_flags(bs, &e) != flags) {
            break;
        }
        if ((flags & QK_BS_OFFSET_VALID) && e.host != first.host + n) {
            break;
        }
        n += e.bytes;
    }
    *pnum = n;
    if (flags & QK_BS_OFFSET_VALID) {
        *map = first.host;
        *file = s->data;
    }
    return flags;
}

static void qcow2_get_info(QkBlock *bs, QkImageInfo *info)
{
    Qcow2State *s = qcow2_state(bs);
    info->cluster_size = (uint32_t)s->cluster_size;
    info->qcow2_version = (int)s->h.version;
    info->refcount_bits = s->refcount_bits;
    info->lazy_refcounts = s->lazy_refcounts;
    info->corrupt = (s->h.incompatible_features & QCOW2_INCOMPAT_CORRUPT) != 0;
    info->dirty = (s->h.incompatible_features & QCOW2_INCOMPAT_DIRTY) != 0;
    info->extended_l2 = s->extended_l2;
    info->compression_type = s->h.compression_type == 1 ? "zstd" : "zlib";
    info->nb_snapshots = (int)s->h.nb_snapshots;
    info->bitmaps = s->bitmaps;
    info->nb_bitmaps = s->nb_bitmaps;
    info->bitmaps_stale = s->bitmaps_stale;
    info->data_file = s->data_file_name;
    info->data_file_raw = s->data_raw;
    info->encrypt = s->encrypt;
}

const QkBlockDriver qk_drv_qcow2 = {
    .format_name = "qcow2",
    .instance_size = sizeof(Qcow2State),
    .probe = qcow2_probe,
    .co_open = qcow2_open,
    .co_close = qcow2_close,
    .co_create = qcow2_co_create,
    .co_preadv = qcow2_co_preadv,
    .co_pwritev = qcow2_co_pwritev,
    .co_pwritev_compressed = qcow2_co_pwritev_compressed,
    .co_pwrite_zeroes = qcow2_co_pwrite_zeroes,
    .co_pdiscard = qcow2_co_pdiscard,
    .co_flush = qcow2_co_flush,
    .co_block_status = qcow2_block_status,
    .co_truncate = qcow2_co_truncate,
    .get_length = qcow2_get_length,
    .get_info = qcow2_get_info,
    .co_save_vmstate = qcow2_co_save_vmstate,
    .co_load_vmstate = qcow2_co_load_vmstate,
    .co_snapshot_list = qcow2_co_snapshot_list,
    .co_snapshot_create = qcow2_co_snapshot_create,
    .co_snapshot_goto = qcow2_co_snapshot_goto,
    .co_snapshot_delete = qcow2_co_snapshot_delete,
    .co_snapshot_load_tmp = qcow2_co_snapshot_load_tmp,
    .co_vmstate_discard = qcow2_co_vmstate_discard,
    .co_make_empty = qcow2_co_make_empty,
    .co_change_backing = qcow2_co_change_backing,
    .co_amend = qcow2_co_amend,
    .bitmap_can_store = qcow2_bitmap_can_store,
    .co_bitmap_begin_change = qcow2_bitmap_begin_change,
    .co_bitmap_remove = qcow2_bitmap_remove_stored,
};
