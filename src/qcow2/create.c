/*
 * Image creation (every qemu-img qcow2 option) and preallocation. Create
 * writes the same minimal layout as qemu-img -- header cluster, refcount
 * table, one refcount block -- then opens the image through the driver and
 * grows it to its size, so the L1 table and any preallocated metadata are
 * placed by the normal allocator.
 */
#include "qcow2/qcow2_int.h"

#include <stdlib.h>
#include <string.h>

int coroutine_fn qcow2_preallocate(Qcow2State *s, uint64_t from, uint64_t to, QkPrealloc mode, QkError *err)
{
    uint64_t cs = s->cluster_size;
    uint64_t c = qk_align_up(from, cs) >> s->cluster_bits;
    uint64_t cend = qk_align_up(to, cs) >> s->cluster_bits;
    uint64_t old_file = s->host_end;
    int r = 0;
    while (c < cend && r == 0) {
        uint64_t l1i = c >> s->l2_bits;
        uint64_t table_end = QK_MIN(cend, (l1i + 1) << s->l2_bits);
        void *t;
        r = qcow2_get_l2_for_write(s, l1i, &t);
        if (r < 0) {
            break;
        }
        while (c < table_end && r == 0) {
            uint64_t bm;
            uint64_t i = c & (s->l2_entries - 1);
            if (qcow2_l2_get(s, t, i, &bm) & (QCOW2_L2E_OFFSET_MASK | QCOW2_OFLAG_COMPRESSED)) {
                c++;
                continue;
            }
            uint64_t n = 1;
            while (c + n < table_end && !qcow2_l2_get(s, t, i + n, &bm)) {
                n++;
            }
            if (qcow2_has_data_file(s)) {
                /* Mapped in place; the data file's own preallocation was
                 * done when it was made. */
                for (uint64_t k = 0; k < n; k++) {
                    qcow2_l2_set(s, t, i + k, ((c + k) << s->cluster_bits) | QCOW2_OFLAG_COPIED, 0);
                }
                qcow2_cache_mark_dirty(s->l2_cache, t);
                c += n;
                continue;
            }
            int64_t host = qcow2_alloc_clusters(s, n);
            if (host < 0) {
                r = (int)host;
                break;
            }
            for (uint64_t k = 0; k < n; k++) {
                /* With extended L2 the subclusters stay unallocated, as qemu-img does. */
                qcow2_l2_set(s, t, i + k, ((uint64_t)host + k * cs) | QCOW2_OFLAG_COPIED, 0);
            }
            qcow2_cache_mark_dirty(s->l2_cache, t);
            uint64_t len = n * cs;
            if ((uint64_t)host < old_file || mode == QK_PREALLOC_FALLOC) {
                /* Reused space may hold old data; fresh space for falloc is reserved. */
                r = qk_co_pwrite_zeroes(s->bs->file, (uint64_t)host, len, 0);
            }
            if (r == 0 && mode == QK_PREALLOC_FULL) {
                for (uint64_t p = 0; p < len && r == 0;) {
                    uint64_t m = QK_MIN(len - p, cs);
                    r = qk_co_pwrite(s->bs->file, (uint64_t)host + p, m, s->zero_buf, 0);
                    p += m;
                }
            }
            c += n;
        }
        qcow2_cache_put(s->l2_cache, &t);
    }
    return r < 0 ? qk_error_set_errno(err, r, "Could not preallocate") : 0;
}

static int validate(const QkCreateOptions *o, int version, uint32_t cs, uint32_t rb, QkError *err)
{
    if (cs < 512 || cs > (2u << 20) || !qk_is_pow2(cs)) {
        return qk_error_set(err, -EINVAL, "Cluster size must be a power of two between 512 and 2048k");
    }
    if (rb < 1 || rb > 64 || !qk_is_pow2(rb)) {
        return qk_error_set(err, -EINVAL, "Refcount width must be a power of two and may not exceed 64 bits");
    }
    if (version == 2) {
        if (rb != 16) {
            return qk_error_set(err, -EINVAL,
                                "Different refcount widths than 16 bits require compatibility level 1.1 or above (use compat=1.1 or greater)");
        }
        if (o->lazy_refcounts) {
            return qk_error_set(err, -EINVAL,
                                "Lazy refcounts only supported with compatibility level 1.1 and above (use compat=1.1 or greater)");
        }
        if (o->extended_l2) {
            return qk_error_set(err, -EINVAL, "Extended L2 entries are only supported with compatibility level 1.1 and above (use compat=1.1 or greater)");
        }
        if (o->compression_type) {
            return qk_error_set(err, -EINVAL, "Non-zlib compression type is only supported with compatibility level 1.1 and above (use compat=1.1 or greater)");
        }
    }
    if (o->extended_l2 && cs < 16384) {
        return qk_error_set(err, -EINVAL, "Extended L2 entries are only supported with cluster sizes of at least 16 KiB");
    }
    if (o->compression_type < 0 || o->compression_type > 1) {
        return qk_error_set(err, -EINVAL, "Unknown compression type");
    }
    if (o->backing_file && o->prealloc != QK_PREALLOC_OFF && !o->extended_l2) {
        return qk_error_set(err, -EINVAL, "Backing file and preallocation can only be used at the same time if extended_l2 is on");
    }
    if (o->backing_file && !o->backing_fmt) {
        return qk_error_set(err, -EINVAL, "Backing file specified without backing format");
    }
    if (o->data_file_raw && !o->data_file) {
        return qk_error_set(err, -EINVAL, "data-file-raw requires data-file");
    }
    if (o->data_file && version == 2) {
        return qk_error_set(err, -EINVAL, "External data files are only supported with compatibility level 1.1 "
                            "and above (use version=v3 or greater)");
    }
    if (o->data_file_raw && o->backing_file) {
        return qk_error_set(err, -EINVAL, "Backing file and data-file-raw cannot be used at the same time");
    }
    if (o->data_file && (!*o->data_file || strlen(o->data_file) > 4095)) {
        return qk_error_set(err, -EINVAL, "invalid data file name");
    }
    return 0;
}

/* Size of the backing image (and a check that it opens). */
static int coroutine_fn backing_size(const char *filename, const QkCreateOptions *o, uint64_t *size, QkError *err)
{
    char *path = qk_block_backing_path(filename, o->backing_file);
    if (!path) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    QkOpenOptions bo = {.flags = QK_OPEN_NO_BACKING, .format = o->backing_fmt};
    QkError berr = {0};
    QkBlock *b = qk_co_block_open(path, &bo, &berr);
    free(path);
    if (!b) {
        return qk_error_set(err, berr.code, "Could not open backing file: %s", berr.msg);
    }
    *size = (uint64_t)qk_block_length(b);
    qk_co_block_close(b);
    return 0;
}

int coroutine_fn qcow2_co_create(const char *filename, const QkCreateOptions *o, QkError *err)
{
    int version = o->compat ? o->compat : 3;
    uint32_t cs = o->cluster_size ? o->cluster_size : 65536;
    uint32_t rb = o->refcount_bits ? o->refcount_bits : 16;
    if (version != 2 && version != 3) {
        return qk_error_set(err, -EINVAL, "Invalid compatibility level");
    }
    int r = validate(o, version, cs, rb, err);
    if (r < 0) {
        return r;
    }
    uint64_t size = o->size;
    if (o->backing_file && !(o->backing_unchecked && o->size_set)) {
        uint64_t bsize = 0;
        r = backing_size(filename, o, &bsize, err);
        if (r < 0) {
            return r;
        }
        if (!o->size_set) {
            size = bsize;
        }
    } else if (!o->size_set) {
        return qk_error_set(err, -EINVAL, "Image creation needs a size parameter");
    }
    if (size > (1ULL << 62)) {
        return qk_error_set(err, -EFBIG, "Image size too large");
    }
    size = qk_align_up(size, 512);

    unsigned cbits = (unsigned)__builtin_ctz(cs);
    Qcow2Header h = {
        .magic = QCOW2_MAGIC,
        .version = (uint32_t)version,
        .cluster_bits = cbits,
        .size = 0,
        .l1_size = 0,
        .l1_table_offset = 0,
        .refcount_table_offset = cs,
        .refcount_table_clusters = 1,
        .refcount_order = (uint32_t)__builtin_ctz(rb),
        .compatible_features = o->lazy_refcounts ? QCOW2_COMPAT_LAZY_REFCOUNTS : 0,
        .incompatible_features = (o->extended_l2 ? QCOW2_INCOMPAT_EXTL2 : 0) |
                                 (o->compression_type ? QCOW2_INCOMPAT_COMPRESSION : 0) |
                                 (o->data_file ? QCOW2_INCOMPAT_DATA_FILE : 0),
        .autoclear_features = o->data_file_raw ? QCOW2_AUTOCLEAR_DATA_FILE_RAW : 0,
        .compression_type = (uint8_t)o->compression_type,
    };
    uint8_t *buf = qk_aligned_zalloc(4096, (size_t)cs * 3);
    if (!buf) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    r = qcow2_build_header(&h, o->backing_file, o->backing_fmt, o->data_file, buf, cs, err);
    if (r < 0) {
        free(buf);
        return r;
    }
    /* Refcount table entry 0 -> the block in cluster 2, which counts clusters 0..2. */
    qk_be64_put(buf + cs, 2ULL * cs);
    Qcow2State tmp = {.refcount_order = h.refcount_order};
    for (int i = 0; i < 3; i++) {
        qcow2_rb_set(&tmp, buf + 2 * cs, (uint64_t)i, 1);
    }
    QkCreateOptions fo = {.size = 0};
    if (o->data_file && qcow2_same_file(filename, o->data_file)) {
        free(buf);
        return qk_error_set(err, -EINVAL, "the external data file '%s' is the image file itself", o->data_file);
    }
    if (o->data_file) {
        /* The guest's bytes, as a new raw file of the disk's size (named
         * as given, relative to the current directory, as qemu-img does
         * and as the image is opened). Preallocation of data happens here. */
        QkCreateOptions dfo = {.size = size, .prealloc = o->prealloc == QK_PREALLOC_METADATA ? QK_PREALLOC_OFF : o->prealloc};
        r = qk_drv_file.co_create(o->data_file, &dfo, err);
        if (r < 0) {
            free(buf);
            return r;
        }
    }
    r = qk_co_protocol_create(filename, &fo, err);
    if (r < 0) {
        free(buf);
        return r;
    }
    QkBlock *file = qk_co_protocol_open(filename, QK_OPEN_RDWR, err);
    if (!file) {
        free(buf);
        return err->code ? err->code : -EIO;
    }
    r = qk_co_pwrite(file, 0, 3ULL * cs, buf, QK_REQ_KIND(QK_IO_HEADER));
    if (r == 0) {
        r = qk_co_flush(file);
    }
    int cr = qk_co_block_close(file);
    r = r < 0 ? r : cr;
    free(buf);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not write qcow2 header");
    }

    QkOpenOptions oo = {.flags = QK_OPEN_RDWR | QK_OPEN_NO_BACKING, .format = "qcow2"};
    QkBlock *bs = qk_co_block_open(filename, &oo, err);
    if (!bs) {
        return err->code ? err->code : -EIO;
    }
    QkPrealloc meta = o->prealloc;
    if (o->data_file && meta != QK_PREALLOC_OFF) {
        meta = QK_PREALLOC_METADATA; /* the data file got its own above */
    }
    if (o->data_file_raw && meta == QK_PREALLOC_OFF) {
        meta = QK_PREALLOC_METADATA; /* a raw data file is mapped whole, as qemu-img does */
    }
    r = qk_co_truncate(bs, size, meta, err);
    cr = qk_co_block_close(bs);
    if (r == 0 && cr < 0) {
        r = qk_error_set_errno(err, cr, "Could not write the new image");
    }
    return r;
}
