/*
 * Persistent dirty bitmaps kept up to date. A read-write open loads every
 * bitmap of the directory into the node's dirty bitmaps (persistent ones):
 * enabled ("auto") bitmaps then track every write, zero write and discard
 * through the node, as the block layer marks all enabled bitmaps. Before
 * the first write can happen, the enabled ones are marked in use on disk,
 * so that a crash leaves them flagged as not saved (never trusted again,
 * only removed), as QEMU leaves them. A clean close stores them: new data
 * clusters and tables, a new directory, then one header write switches to
 * it, and only then are the old clusters freed (a reference reaches the
 * disk after the refcounts it needs, a refcount drops after its
 * reference is gone). Bitmaps that did not change keep their clusters.
 *
 * Bitmaps found in use stay as they are, unused, until removed. Bitmaps
 * this code cannot keep (an unknown type or flag, a granularity outside
 * 512 B..2 GiB, a table of the wrong size) refuse the read-write open
 * rather than being silently invalidated.
 */
#include "qcow2/qcow2_int.h"
#include "block/dirty_bitmap.h"

#include <stdlib.h>
#include <string.h>

#define BME_KNOWN_FLAGS (QCOW2_BME_IN_USE | QCOW2_BME_AUTO | QCOW2_BME_EXTRA_COMPAT)
#define BME_TYPE_DIRTY 1
#define BME_MIN_GBITS 9
#define BME_MAX_GBITS 31
/* QEMU's bounds on one bitmap: its table's entries and its data. */
#define BME_MAX_TABLE_SIZE 0x8000000u
#define BME_MAX_DATA (512ULL << 20)
#define BME_ENTRY_RESERVED 0xff000000000001feULL
#define BME_ENTRY_OFFSET 0x00fffffffffffe00ULL
#define BME_ALL_ONES 1ULL

/* An entry that breaks the specification's rules is never read and
 * never freed. */
bool qcow2_bitmap_entry_ok(uint64_t te, uint64_t cs)
{
    uint64_t off = te & BME_ENTRY_OFFSET;
    return !(te & BME_ENTRY_RESERVED) && !(off && (te & BME_ALL_ONES)) && qk_is_aligned(off, cs);
}

static uint64_t data_bytes(uint64_t disk, unsigned gbits)
{
    return QK_DIV_ROUND_UP(QK_DIV_ROUND_UP(disk, 1ULL << gbits), 8);
}

static uint64_t table_entries(const Qcow2State *s, uint64_t disk, unsigned gbits)
{
    return QK_DIV_ROUND_UP(data_bytes(disk, gbits), s->cluster_size);
}

void qcow2_bitmaps_forget(Qcow2State *s)
{
    qcow2_bitmap_dir_free(&s->bm_disk);
    free(s->bm_disk_flags);
    s->bm_disk_flags = NULL;
    s->bm_live = false;
}

/* Sets bm's bits from one cluster of bitmap data: bit k of byte i covers
 * chunk 8 * i + k (the format's order), from chunk `first` on. */
static void set_from_bytes(QkDirtyBitmap *bm, uint64_t first, const uint8_t *buf, uint64_t len)
{
    uint64_t nbits = qk_hbitmap_size(bm->bits);
    uint64_t run = 0, run_len = 0;
    for (uint64_t i = 0; i < len; i++) {
        if (!buf[i]) {
            continue;
        }
        for (unsigned k = 0; k < 8; k++) {
            uint64_t b = first + i * 8 + k;
            if (!(buf[i] >> k & 1) || b >= nbits) {
                continue;
            }
            if (run_len && run + run_len == b) {
                run_len++;
                continue;
            }
            if (run_len) {
                qk_hbitmap_set(bm->bits, run, run_len);
            }
            run = b;
            run_len = 1;
        }
    }
    if (run_len) {
        qk_hbitmap_set(bm->bits, run, run_len);
    }
}

/* The bits of chunks [first, first + 8 * len) into buf; false when none is set. */
static bool get_bytes(const QkDirtyBitmap *bm, uint64_t first, uint8_t *buf, uint64_t len)
{
    memset(buf, 0, len);
    uint64_t end = QK_MIN(first + len * 8, qk_hbitmap_size(bm->bits));
    uint64_t b = qk_hbitmap_next_set(bm->bits, first);
    bool any = false;
    while (b != UINT64_MAX && b < end) {
        /* Bounded by the window: each of a table's clusters is filled in
         * turn, and an unbounded search through a fully dirty bitmap
         * made storing it quadratic. */
        uint64_t z = qk_hbitmap_next_zero_before(bm->bits, b, end);
        uint64_t stop = z == UINT64_MAX ? end : z;
        uint64_t x = b - first, e = stop - first;
        for (; x < e && x % 8; x++) {
            buf[x / 8] |= (uint8_t)(1u << (x % 8));
        }
        if (e - x >= 8) {
            memset(buf + x / 8, 0xff, (e - x) / 8);
            x += (e - x) / 8 * 8;
        }
        for (; x < e; x++) {
            buf[x / 8] |= (uint8_t)(1u << (x % 8));
        }
        any = true;
        b = stop < end ? qk_hbitmap_next_set(bm->bits, stop) : UINT64_MAX;
    }
    return any;
}

enum { TABLE_OK, TABLE_INVALID, TABLE_PAST_EOF };

/* Reads a bitmap's table into *table (host order; the caller frees it)
 * and says whether it has an entry the format forbids (or cannot be read:
 * see Qcow2BmEntry.broken) or, worse, one past the end of the file: a
 * writer would grow the file over that cluster and put data there, which
 * a later removal of the bitmap, finding the entry good by then, would
 * free under the data. */
static int coroutine_fn scan_table(Qcow2State *s, const Qcow2BmEntry *e, uint64_t **table, uint64_t *past)
{
    uint64_t cs = s->cluster_size;
    uint64_t n = e->table_size;
    uint64_t *t = n ? malloc(n * 8) : NULL;
    int kind = n && (!t || qk_co_pread(s->bs->file, e->table_off, n * 8, t, 0) < 0) ? TABLE_INVALID : TABLE_OK;
    for (uint64_t i = 0; kind == TABLE_OK && i < n; i++) {
        uint64_t te = t[i] = be64toh(t[i]), off = te & BME_ENTRY_OFFSET;
        if (!qcow2_bitmap_entry_ok(te, cs)) {
            kind = TABLE_INVALID;
        }
        if (off && !qk_range_within(off, cs, s->file_size)) {
            *past = off;
            kind = TABLE_PAST_EOF;
        }
    }
    *table = t;
    return kind;
}

/* Reads one consistent bitmap's data through its table t, which
 * scan_table found valid and inside the file. */
static int coroutine_fn load_data(Qcow2State *s, const Qcow2BmEntry *e, const uint64_t *t, QkDirtyBitmap *bm)
{
    uint64_t cs = s->cluster_size;
    uint64_t n = e->table_size;
    uint8_t *buf = qk_aligned_alloc(qk_block_buf_align(s->bs->file), cs);
    int r = buf ? 0 : -ENOMEM;
    uint64_t chunks_per_cluster = cs * 8;
    uint64_t total = data_bytes(s->bs->size, e->gbits);
    for (uint64_t i = 0; r == 0 && i < n; i++) {
        uint64_t off = t[i] & BME_ENTRY_OFFSET;
        uint64_t len = QK_MIN(cs, total - i * cs);
        if (!off) {
            if (t[i] & BME_ALL_ONES) {
                qk_hbitmap_set(bm->bits, i * chunks_per_cluster, chunks_per_cluster);
            }
        } else {
            r = qk_co_pread(s->bs->file, off, len, buf, 0);
            if (r == 0) {
                set_from_bytes(bm, i * chunks_per_cluster, buf, len);
            }
        }
    }
    free(buf);
    return r;
}

#define RO_HINT "; open the image read-only"

/* Checks what this code needs to keep a bitmap up to date; a message
 * naming the bitmap when it cannot (with rw, the advice to open the image
 * read-only). Also how `info` finds the bitmaps it should warn about. */
int qcow2_bitmap_check_entry(Qcow2State *s, const Qcow2BmEntry *e, bool rw, QkError *err)
{
    if (e->flags & ~BME_KNOWN_FLAGS) {
        return qk_error_set(err, -ENOTSUP, "Bitmap '%s' has unknown flags %#x%s", e->name,
                            e->flags & ~BME_KNOWN_FLAGS, rw ? RO_HINT : "");
    }
    if (e->type != BME_TYPE_DIRTY) {
        return qk_error_set(err, -ENOTSUP, "Bitmap '%s' has an unknown type %u%s", e->name,
                            e->type, rw ? RO_HINT : "");
    }
    if (e->gbits < BME_MIN_GBITS || e->gbits > BME_MAX_GBITS) {
        return qk_error_set(err, -ENOTSUP, "Bitmap '%s' has a granularity of 2^%u bytes (supported: 2^%d to 2^%d)%s",
                            e->name, e->gbits, BME_MIN_GBITS, BME_MAX_GBITS, rw ? RO_HINT : "");
    }
    if (data_bytes(s->bs->size, e->gbits) > BME_MAX_DATA || e->table_size > BME_MAX_TABLE_SIZE) {
        return qk_error_set(err, -ENOTSUP, "Bitmap '%s' is too large", e->name);
    }
    if (!qk_is_aligned(e->table_off, s->cluster_size) || e->table_size > BME_MAX_TABLE_SIZE ||
        !qk_range_within(e->table_off, (uint64_t)e->table_size * 8, s->file_size)) {
        return qk_error_corrupt(err, "bitmap '%s' has an invalid bitmap table", e->name);
    }
    /* One in use is kept as it is, never read: its size may be an old one. */
    if (!(e->flags & QCOW2_BME_IN_USE) &&
        (e->table_size != table_entries(s, s->bs->size, e->gbits) || (e->table_size && e->table_off == 0))) {
        return qk_error_corrupt(err, "bitmap '%s' has an invalid bitmap table", e->name);
    }
    return 0;
}

/* Writes the stored directory in place (same size and place) with the
 * flags of s->bm_disk_flags, then flushes: in use is durable before the
 * change it announces. d->e keeps the flags as stored, which a bitmap
 * that does not change keeps at the next store. */
static int coroutine_fn write_disk_flags(Qcow2State *s)
{
    Qcow2BmDir *d = &s->bm_disk;
    uint8_t *buf = calloc(1, d->size);
    uint32_t *stored = calloc(d->n ? d->n : 1, sizeof(*stored));
    int r = buf && stored ? 0 : -ENOMEM;
    if (r == 0) {
        for (uint32_t i = 0; i < d->n; i++) {
            stored[i] = d->e[i].flags;
            d->e[i].flags = s->bm_disk_flags[i];
        }
        qcow2_bitmap_dir_layout(d->e, d->n, buf);
        for (uint32_t i = 0; i < d->n; i++) {
            d->e[i].flags = stored[i];
        }
        r = qcow2_co_write_new_meta(s, d->off, d->size, buf, QCOW2_OL_BITMAP_DIR, QK_REQ_KIND(QK_IO_BITMAP));
    }
    free(buf);
    free(stored);
    return r < 0 ? r : qk_co_flush(s->bs->file);
}

int coroutine_fn qcow2_bitmap_begin_change(QkBlock *bs, QkDirtyBitmap *bm, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (!bm->persistent || !bm->disk_slot || !s->bm_live || !s->bm_disk_flags) {
        return 0; /* not stored yet: nothing on disk to go stale */
    }
    qk_co_mutex_lock(&s->bm_lock);
    uint32_t *f = &s->bm_disk_flags[bm->disk_slot - 1];
    int r = 0;
    if (!(*f & QCOW2_BME_IN_USE)) {
        *f |= QCOW2_BME_IN_USE;
        r = write_disk_flags(s);
        if (r < 0) {
            *f &= ~QCOW2_BME_IN_USE;
            qk_error_set_errno(err, r, "Could not mark bitmap '%s' in use", bm->name);
        }
    }
    qk_co_mutex_unlock(&s->bm_lock);
    return r;
}

/* Before a resize (bm_lock held): every stored bitmap marked in use. */
static int coroutine_fn mark_all_in_use(Qcow2State *s, QkError *err)
{
    Qcow2BmDir *d = &s->bm_disk;
    /* As QEMU refuses: its size would change under a bitmap already
     * known to be out of date. */
    for (uint32_t i = 0; i < d->n; i++) {
        if (d->e[i].flags & QCOW2_BME_IN_USE) {
            return qk_error_set(err, -EBUSY, "Bitmap '%s' is inconsistent and cannot be used\n"
                                "Try 'qcowkit bitmap --remove' to delete this bitmap from disk", d->e[i].name);
        }
    }
    /* Every stored bitmap, disabled ones too, describes the old size
     * until the store at close: marked in use (durably) before the new
     * size reaches the header, a crash in between leaves them stale,
     * not invalid. */
    uint32_t *old = malloc((d->n ? d->n : 1) * sizeof(*old));
    if (!old) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    bool change = false;
    for (uint32_t i = 0; i < d->n; i++) {
        old[i] = s->bm_disk_flags[i];
        change |= !(old[i] & QCOW2_BME_IN_USE);
        s->bm_disk_flags[i] |= QCOW2_BME_IN_USE;
    }
    int r = change ? write_disk_flags(s) : 0;
    if (r < 0) {
        memcpy(s->bm_disk_flags, old, d->n * sizeof(*old));
        qk_error_set_errno(err, r, "Could not mark the bitmaps in use");
    }
    free(old);
    return r;
}

int coroutine_fn qcow2_bitmaps_begin_resize(Qcow2State *s, uint64_t new_size, QkError *err)
{
    Qcow2BmDir *d = &s->bm_disk;
    if (new_size == 0) {
        bool any = d->n > 0;
        for (QkDirtyBitmap *bm = s->bs->dirty_bitmaps; bm && !any; bm = bm->next) {
            any = bm->persistent;
        }
        if (any) {
            /* A stored bitmap's table has at least one entry, and one for
             * an empty disk would have none: qemu-img would refuse the
             * image, or lose the bitmaps at close. */
            return qk_error_set(err, -ENOTSUP, "Cannot make the disk empty: it has persistent bitmaps, which "
                                "cannot describe an empty disk (remove them first)");
        }
    }
    if (!s->bm_live || !s->bm_disk_flags) {
        return 0;
    }
    qk_co_mutex_lock(&s->bm_lock);
    int r = mark_all_in_use(s, err);
    qk_co_mutex_unlock(&s->bm_lock);
    return r;
}

int qcow2_bitmap_can_store(QkBlock *bs, const char *name, uint64_t granularity, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    const char *why = NULL;
    uint32_t n = 0;
    for (QkDirtyBitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
        n += bm->persistent;
    }
    if (!qcow2_is_v3(s)) {
        why = "Cannot store dirty bitmaps in qcow2 v2 files";
    } else if (!s->bm_live) {
        why = "the image is not open read-write";
    } else if (strlen(name) > 1023) {
        why = "Name length exceeds maximum (1023 characters)";
    } else if (n >= 65535) {
        why = "Maximum number of persistent bitmaps is already reached";
    } else if (granularity < 512 || granularity > (1ULL << BME_MAX_GBITS) || (granularity & (granularity - 1))) {
        why = "Granularity must be a power of two from 512 bytes to 2 GiB";
    } else if (data_bytes(bs->size, (unsigned)__builtin_ctzll(granularity)) > BME_MAX_DATA) {
        why = "Too large bitmap: its data would exceed 512 MiB";
    } else if (bs->size == 0) {
        /* Its table would have no entry, which the format does not allow. */
        why = "the disk is empty (size 0)";
    }
    if (why) {
        return qk_error_set(err, -ENOTSUP, "Can't make bitmap '%s' persistent in '%s': %s", name, bs->filename, why);
    }
    return 0;
}

int coroutine_fn qcow2_bitmaps_open(QkBlock *bs, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (!(s->h.autoclear_features & QCOW2_AUTOCLEAR_BITMAPS)) {
        /* None to load (or stale ones, dropped by this open): new ones
         * can still be added and are stored on close. */
        s->bm_live = !s->read_only && qcow2_is_v3(s);
        return 0;
    }
    Qcow2BmDir *d = &s->bm_disk;
    const char *why;
    int r = qcow2_bitmap_dir_read(s, d, &why);
    if (r == -QK_ECORRUPT) {
        return qk_error_corrupt(err, "%s (the image can be opened read-only)",
                                why ? why : "the bitmap directory is invalid");
    }
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not read the bitmap directory");
    }
    const char *dup = NULL;
    r = qcow2_bitmap_dir_dup_name(d, &dup);
    if (r > 0) {
        r = qk_error_corrupt(err, "bitmap name '%s' appears more than once", dup);
    } else if (r < 0) {
        r = qk_error_set(err, r, "out of memory");
    }
    for (uint32_t i = 0; i < d->n && r == 0; i++) {
        const Qcow2BmEntry *e = &d->e[i];
        r = qcow2_bitmap_check_entry(s, e, true, err);
        if (r < 0) {
            break;
        }
        QkDirtyBitmap *bm = qk_dirty_bitmap_add(bs, e->name, 1ULL << e->gbits, err);
        if (!bm) {
            r = err->code ? err->code : -ENOMEM;
            break;
        }
        bm->persistent = true;
        bm->disk_slot = i + 1;
        bm->enabled = false;
        uint64_t past = 0;
        uint64_t *table;
        int kind = scan_table(s, e, &table, &past);
        if (kind == TABLE_PAST_EOF && !s->read_only) {
            free(table);
            r = qk_error_corrupt(err, "bitmap '%s' has a table entry past the end of the file (%#llx), "
                                 "which a write could reuse; the image can be opened read-only (convert copies "
                                 "it without the bitmap)", e->name, (unsigned long long)past);
            break;
        }
        d->e[i].broken = kind != TABLE_OK;
        /* In use: not saved after its last change. Unknown extra data
         * without the compatible flag: not ours to interpret. Both are
         * kept as they are and never used. */
        if ((e->flags & QCOW2_BME_IN_USE) || (e->extra_len && !(e->flags & QCOW2_BME_EXTRA_COMPAT))) {
            free(table);
            bm->inconsistent = true;
            continue;
        }
        r = kind == TABLE_OK ? load_data(s, e, table, bm) : -QK_ECORRUPT;
        free(table);
        if (r == -QK_ECORRUPT) {
            /* A table qemu-img refuses to open the image for. Kept as it
             * is and never used, as one in use is, so the image stays
             * usable and the bitmap can still be removed. */
            qcow2_note_corruption(s, "Bitmap '%s' has an invalid table entry; it is kept unchanged and cannot be "
                                  "used (remove it)", e->name);
            qk_hbitmap_reset_all(bm->bits);
            bm->inconsistent = true;
            d->e[i].broken = true;
            r = 0;
            continue;
        }
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not read bitmap '%s'", e->name);
            break;
        }
        bm->enabled = (e->flags & QCOW2_BME_AUTO) != 0;
        bm->changed = bm->enabled;
    }
    if (r == 0 && !s->read_only) {
        /* Enabled bitmaps change with the first write: in use on disk first. */
        s->bm_disk_flags = calloc(d->n ? d->n : 1, sizeof(*s->bm_disk_flags));
        r = s->bm_disk_flags ? 0 : -ENOMEM;
        bool any = false;
        for (uint32_t i = 0; r == 0 && i < d->n; i++) {
            s->bm_disk_flags[i] = d->e[i].flags;
        }
        for (QkDirtyBitmap *bm = bs->dirty_bitmaps; r == 0 && bm; bm = bm->next) {
            if (bm->persistent && bm->enabled && !(s->bm_disk_flags[bm->disk_slot - 1] & QCOW2_BME_IN_USE)) {
                s->bm_disk_flags[bm->disk_slot - 1] |= QCOW2_BME_IN_USE;
                any = true;
            }
        }
        if (r == 0 && any) {
            r = write_disk_flags(s);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not mark the bitmaps in use");
            }
        }
    }
    if (r < 0) {
        for (QkDirtyBitmap *bm = bs->dirty_bitmaps, *next; bm; bm = next) {
            next = bm->next;
            if (bm->persistent) {
                qk_dirty_bitmap_remove(bs, bm, NULL);
            }
        }
        qcow2_bitmaps_forget(s);
        return r;
    }
    s->bm_live = !s->read_only;
    return 0;
}

/* Writes bm's data into new clusters and a new table; fills the entry's
 * table fields. The new clusters are counted (refcounts in the cache). */
static int coroutine_fn write_bitmap(Qcow2State *s, const QkDirtyBitmap *bm, Qcow2BmEntry *e)
{
    uint64_t cs = s->cluster_size;
    unsigned gbits = (unsigned)__builtin_ctzll(bm->granularity);
    uint64_t n = table_entries(s, s->bs->size, gbits);
    uint64_t total = data_bytes(s->bs->size, gbits);
    uint64_t tbytes = qk_align_up(n * 8, cs);
    uint64_t *t = qk_aligned_zalloc(qk_block_buf_align(s->bs->file), tbytes ? tbytes : cs);
    uint8_t *buf = qk_aligned_alloc(qk_block_buf_align(s->bs->file), cs);
    int r = t && buf ? 0 : -ENOMEM;
    for (uint64_t i = 0; r == 0 && i < n; i++) {
        uint64_t len = QK_MIN(cs, total - i * cs);
        if (!get_bytes(bm, i * cs * 8, buf, len)) {
            continue; /* entry 0: reads as zeros */
        }
        if (len < cs) {
            memset(buf + len, 0, cs - len);
        }
        qk_co_mutex_lock(&s->lock);
        int64_t h = qcow2_alloc_clusters(s, 1);
        qk_co_mutex_unlock(&s->lock);
        r = h < 0 ? (int)h : qcow2_co_write_new_meta(s, (uint64_t)h, cs, buf, 0, QK_REQ_KIND(QK_IO_BITMAP));
        if (h >= 0) {
            t[i] = htobe64((uint64_t)h);
        }
    }
    if (r == 0 && n) {
        qk_co_mutex_lock(&s->lock);
        int64_t h = qcow2_alloc_clusters(s, tbytes / cs);
        qk_co_mutex_unlock(&s->lock);
        r = h < 0 ? (int)h : qcow2_co_write_new_meta(s, (uint64_t)h, tbytes, t, 0, QK_REQ_KIND(QK_IO_BITMAP));
        if (h >= 0) {
            e->table_off = (uint64_t)h;
        }
    }
    e->table_size = (uint32_t)n;
    e->type = BME_TYPE_DIRTY;
    e->gbits = (uint8_t)gbits;
    if (r < 0) {
        /* Never referenced: give back what was taken. */
        qk_co_mutex_lock(&s->lock);
        for (uint64_t i = 0; t && i < n; i++) {
            if (t[i]) {
                qcow2_free_clusters(s, be64toh(t[i]), cs);
            }
        }
        if (e->table_off) {
            qcow2_free_clusters(s, e->table_off, tbytes);
            e->table_off = 0;
        }
        qk_co_mutex_unlock(&s->lock);
    }
    free(t);
    free(buf);
    return r;
}

/* Frees a stored bitmap's data clusters and table (its directory entry is
 * gone from the header's directory by now). A cluster that is also live
 * metadata (a damaged or hostile directory naming the L1 table, say) is
 * left alone, a leak at worst: freeing it would hand the table to the
 * allocator, and the next write would overwrite it. So is one under an
 * entry the format forbids, and one past the end of the file; and every
 * data cluster of a table that had such an entry when the image was
 * opened (e->broken). */
static int coroutine_fn free_bitmap(Qcow2State *s, const Qcow2BmEntry *e)
{
    uint64_t cs = s->cluster_size;
    uint64_t n = e->table_size;
    if (!n || !e->table_off) {
        return 0;
    }
    uint64_t *t = malloc(n * 8);
    int r = t ? qk_co_pread(s->bs->file, e->table_off, n * 8, t, 0) : -ENOMEM;
    qk_co_mutex_lock(&s->lock);
    for (uint64_t i = 0; r == 0 && !e->broken && i < n; i++) {
        uint64_t te = be64toh(t[i]), off = te & BME_ENTRY_OFFSET;
        if (off && qcow2_bitmap_entry_ok(te, cs) && qk_range_within(off, cs, s->file_size) &&
            !qcow2_meta_overlap(s, off, cs, 0)) {
            r = qcow2_free_clusters(s, off, cs);
        }
    }
    if (r == 0 && !qcow2_meta_overlap(s, e->table_off, qk_align_up(n * 8, cs), 0)) {
        r = qcow2_free_clusters(s, e->table_off, qk_align_up(n * 8, cs));
    }
    qk_co_mutex_unlock(&s->lock);
    free(t);
    return r;
}

/* Sets (or drops) the bitmaps extension in the in-memory list. */
static int set_extension(Qcow2State *s, uint32_t n, uint64_t size, uint64_t off)
{
    Qcow2Ext **p = &s->exts, *x = NULL;
    for (; *p; p = &(*p)->next) {
        if ((*p)->type == QCOW2_EXT_BITMAPS) {
            x = *p;
            break;
        }
    }
    if (!n) {
        if (x) {
            *p = x->next;
            free(x->data);
            free(x);
        }
        return 0;
    }
    if (!x) {
        x = calloc(1, sizeof(*x));
        if (!x) {
            return -ENOMEM;
        }
        x->type = QCOW2_EXT_BITMAPS;
        x->next = s->exts;
        s->exts = x;
    }
    free(x->data);
    x->data = calloc(1, 24);
    x->len = 24;
    if (!x->data) {
        x->len = 0;
        return -ENOMEM;
    }
    qk_be32_put(x->data, n);
    qk_be64_put(x->data + 8, size);
    qk_be64_put(x->data + 16, off);
    return 0;
}

/* Writes a directory of n entries into new clusters and points the
 * header at it (n == 0: drops the extension and its autoclear bit). The
 * new clusters and their counts are durable before the header names
 * them; the header write is flushed. The old directory stays allocated:
 * the caller frees it, and what only it referred to, once this returns 0. */
static int coroutine_fn switch_directory(Qcow2State *s, const Qcow2BmEntry *ne, uint32_t n, uint64_t dir_size,
                                         uint64_t *dir_off, QkError *err)
{
    QkBlock *bs = s->bs;
    int r = 0;
    *dir_off = 0;
    if (n) {
        uint64_t alloc = qk_align_up(dir_size, s->cluster_size);
        uint8_t *buf = qk_aligned_zalloc(qk_block_buf_align(bs->file), alloc);
        r = buf ? 0 : -ENOMEM;
        if (r == 0) {
            qcow2_bitmap_dir_layout(ne, n, buf);
            qk_co_mutex_lock(&s->lock);
            int64_t h = qcow2_alloc_clusters(s, alloc / s->cluster_size);
            qk_co_mutex_unlock(&s->lock);
            r = h < 0 ? (int)h : qcow2_co_write_new_meta(s, (uint64_t)h, alloc, buf, 0, QK_REQ_KIND(QK_IO_BITMAP));
            *dir_off = h < 0 ? 0 : (uint64_t)h;
        }
        free(buf);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not write the bitmap directory");
        }
    }
    qk_co_mutex_lock(&s->lock);
    r = qcow2_flush_caches(s);
    qk_co_mutex_unlock(&s->lock);
    if (r == 0) {
        r = qk_co_flush(bs->file);
    }
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not write the bitmaps");
    }
    r = set_extension(s, n, dir_size, *dir_off);
    if (r < 0) {
        return qk_error_set(err, r, "out of memory");
    }
    Qcow2Header h = s->h;
    if (n) {
        h.autoclear_features |= QCOW2_AUTOCLEAR_BITMAPS;
    } else {
        h.autoclear_features &= ~QCOW2_AUTOCLEAR_BITMAPS;
    }
    return qcow2_co_rewrite_header(bs, &h, err);
}

/* Frees the old directory's clusters, unless they are live metadata. */
static void free_old_directory(Qcow2State *s, const Qcow2BmDir *d)
{
    uint64_t dbytes = qk_align_up(d->size, s->cluster_size);
    if (d->size && !qcow2_meta_overlap(s, d->off, dbytes, QCOW2_OL_BITMAP_DIR)) {
        qk_co_mutex_lock(&s->lock);
        qcow2_free_clusters(s, d->off, dbytes);
        qk_co_mutex_unlock(&s->lock);
    }
}

/* Takes a stored bitmap out of the image now, as QEMU does: a new
 * directory without its entry (the others with their flags as on disk
 * now), the header switched to it, then its clusters and the old
 * directory freed. A crash leaves either the old directory, with the
 * entry in use if it had changed, or the new one, with at most leaked
 * clusters. The node's bitmap itself is the caller's to drop. */
int coroutine_fn qcow2_bitmap_remove_stored(QkBlock *bs, QkDirtyBitmap *bm, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (!bm->persistent || !bm->disk_slot || !s->bm_live || !s->bm_disk_flags) {
        return 0; /* nothing stored */
    }
    qk_co_mutex_lock(&s->bm_lock);
    Qcow2BmDir *d = &s->bm_disk;
    uint32_t gone = bm->disk_slot - 1, n = d->n - 1;
    Qcow2BmEntry *ne = calloc(n ? n : 1, sizeof(*ne));
    int r = ne ? 0 : qk_error_set(err, -ENOMEM, "out of memory");
    uint64_t dir_size = 0, dir_off = 0;
    for (uint32_t i = 0, k = 0; r == 0 && i < d->n; i++) {
        if (i != gone) {
            ne[k] = d->e[i];
            ne[k].flags = s->bm_disk_flags[i];
            dir_size += qcow2_bitmap_entry_len(&ne[k++]);
        }
    }
    if (r == 0) {
        r = switch_directory(s, ne, n, dir_size, &dir_off, err);
    }
    free(ne);
    if (r == 0) {
        /* Nothing on disk names them now. A failure here leaks, no more. */
        free_bitmap(s, &d->e[gone]);
        free_old_directory(s, d);
        free(d->e[gone].name);
        free(d->e[gone].extra);
        memmove(&d->e[gone], &d->e[gone + 1], (n - gone) * sizeof(*d->e));
        memmove(&s->bm_disk_flags[gone], &s->bm_disk_flags[gone + 1], (n - gone) * sizeof(*s->bm_disk_flags));
        d->n = n;
        d->off = dir_off;
        d->size = n ? dir_size : 0;
        for (QkDirtyBitmap *o = bs->dirty_bitmaps; o; o = o->next) {
            if (o->persistent && o->disk_slot > gone + 1) {
                o->disk_slot--;
            }
        }
        bm->disk_slot = 0;
    }
    qk_co_mutex_unlock(&s->bm_lock);
    return r;
}

static int coroutine_fn store_locked(QkBlock *bs, QkError *err);

/* At the close; a removal still switching the directory finishes first. */
int coroutine_fn qcow2_bitmaps_store(QkBlock *bs, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    qk_co_mutex_lock(&s->bm_lock);
    int r = store_locked(bs, err);
    qk_co_mutex_unlock(&s->bm_lock);
    return r;
}

static int coroutine_fn store_locked(QkBlock *bs, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (!s->bm_live || s->read_only) {
        return 0;
    }
    Qcow2BmDir *d = &s->bm_disk;
    uint32_t n = 0;
    bool same = true; /* every stored bitmap kept as it is, none added */
    for (QkDirtyBitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
        n += bm->persistent;
        same &= !bm->persistent || (bm->disk_slot && (bm->inconsistent || !bm->changed));
        /* A kept bitmap that a resize marked in use on disk (its bits
         * unchanged: the last one covers the new part) must have the
         * directory written again, or it stays in use for good. */
        same &= !bm->persistent || !bm->disk_slot || !s->bm_disk_flags ||
                s->bm_disk_flags[bm->disk_slot - 1] == d->e[bm->disk_slot - 1].flags;
    }
    if (same && n == d->n) {
        return 0;
    }
    Qcow2BmEntry *ne = calloc(n ? n : 1, sizeof(*ne));
    bool *kept = calloc(d->n ? d->n : 1, sizeof(*kept));
    QkDirtyBitmap **order = calloc(n ? n : 1, sizeof(*order));
    int r = ne && kept && order ? 0 : -ENOMEM;
    /* The stored order first, then new bitmaps in the order they were made
     * (the node's list has the newest first). */
    uint32_t k = 0;
    for (uint32_t i = 0; r == 0 && i < d->n; i++) {
        for (QkDirtyBitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
            if (bm->persistent && bm->disk_slot == i + 1) {
                order[k++] = bm;
            }
        }
    }
    uint32_t first_new = k;
    for (QkDirtyBitmap *bm = bs->dirty_bitmaps; r == 0 && bm; bm = bm->next) {
        if (bm->persistent && !bm->disk_slot) {
            order[k++] = bm;
        }
    }
    for (uint32_t a = first_new, b = k; a + 1 < b; a++, b--) {
        QkDirtyBitmap *x = order[a];
        order[a] = order[b - 1];
        order[b - 1] = x;
    }
    uint64_t dir_size = 0;
    for (uint32_t i = 0; r == 0 && i < n; i++) {
        QkDirtyBitmap *bm = order[i];
        const Qcow2BmEntry *old = bm->disk_slot ? &d->e[bm->disk_slot - 1] : NULL;
        Qcow2BmEntry *e = &ne[i];
        e->name = bm->name;
        if (old) {
            e->extra = old->extra;
            e->extra_len = old->extra_len;
        }
        if (old && (bm->inconsistent || !bm->changed)) {
            /* As stored: its clusters stay. */
            e->table_off = old->table_off;
            e->table_size = old->table_size;
            e->type = old->type;
            e->gbits = old->gbits;
            e->flags = old->flags;
            e->broken = old->broken;
            kept[bm->disk_slot - 1] = true;
        } else {
            e->flags = (bm->enabled ? QCOW2_BME_AUTO : 0) | (old ? old->flags & QCOW2_BME_EXTRA_COMPAT : 0);
            r = write_bitmap(s, bm, e);
            if (r < 0) {
                qk_error_set_errno(err, r, "Could not write bitmap '%s'", bm->name);
            }
        }
        dir_size += qcow2_bitmap_entry_len(e);
    }
    uint64_t dir_off = 0;
    if (r == 0) {
        r = switch_directory(s, ne, n, dir_size, &dir_off, err);
    }
    if (r == 0) {
        /* The header names the new directory: the old one and what only
         * it referred to can go. A failure here leaks clusters, no more. */
        for (uint32_t i = 0; i < d->n; i++) {
            if (!kept[i]) {
                free_bitmap(s, &d->e[i]);
            }
        }
        free_old_directory(s, d);
        /* What is stored now is the baseline for the next store: the
         * entries get their own copies before the old ones go. */
        for (uint32_t i = 0; i < n; i++) {
            ne[i].name = strdup(ne[i].name);
            if (ne[i].extra_len) {
                uint8_t *x = malloc(ne[i].extra_len);
                if (x) {
                    memcpy(x, ne[i].extra, ne[i].extra_len);
                }
                ne[i].extra = x;
            }
            order[i]->disk_slot = i + 1;
            order[i]->changed = order[i]->enabled;
        }
        qcow2_bitmap_dir_free(d);
        d->e = ne;
        d->n = n;
        d->off = dir_off;
        d->size = dir_size;
        ne = NULL;
        free(s->bm_disk_flags);
        s->bm_disk_flags = calloc(n ? n : 1, sizeof(*s->bm_disk_flags));
        for (uint32_t i = 0; s->bm_disk_flags && i < n; i++) {
            s->bm_disk_flags[i] = d->e[i].flags;
        }
    }
    free(ne);
    free(kept);
    free(order);
    return r;
}
