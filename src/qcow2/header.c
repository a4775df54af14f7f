/*
 * The qcow2 header: reading it, validating every field before anything
 * trusts it, parsing header extensions (kept verbatim, unknown ones too),
 * in-place updates of single fields (so unknown extensions and trailing
 * header bytes are never rewritten), building a header for create, and
 * changing the backing file (rebase), the one update that must rewrite
 * the extension area: it keeps every other extension verbatim.
 */
#include "qcow2/qcow2_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    uint8_t type, bit;
    const char *name;
} feature_names[] = {
    {0, 0, "dirty bit"},
    {0, 1, "corrupt bit"},
    {0, 2, "external data file"},
    {0, 3, "compression type"},
    {0, 4, "extended L2 entries"},
    {1, 0, "lazy refcounts"},
    {2, 0, "bitmaps"},
    {2, 1, "raw external data"},
};

void qcow2_header_to_be(const Qcow2Header *h, uint8_t *b)
{
    memset(b, 0, QCOW2_HEADER_WRITE_LEN);
    qk_be32_put(b + 0, h->magic);
    qk_be32_put(b + 4, h->version);
    qk_be64_put(b + 8, h->backing_file_offset);
    qk_be32_put(b + 16, h->backing_file_size);
    qk_be32_put(b + 20, h->cluster_bits);
    qk_be64_put(b + 24, h->size);
    qk_be32_put(b + 32, h->crypt_method);
    qk_be32_put(b + 36, h->l1_size);
    qk_be64_put(b + 40, h->l1_table_offset);
    qk_be64_put(b + 48, h->refcount_table_offset);
    qk_be32_put(b + 56, h->refcount_table_clusters);
    qk_be32_put(b + 60, h->nb_snapshots);
    qk_be64_put(b + 64, h->snapshots_offset);
    qk_be64_put(b + 72, h->incompatible_features);
    qk_be64_put(b + 80, h->compatible_features);
    qk_be64_put(b + 88, h->autoclear_features);
    qk_be32_put(b + 96, h->refcount_order);
    qk_be32_put(b + 100, h->header_length);
    b[104] = h->compression_type;
}

int coroutine_fn qcow2_read_header(QkBlock *file, Qcow2Header *h, uint8_t **cluster0,
                                   uint64_t *file_len, QkError *err)
{
    int64_t len = qk_block_length(file);
    if (len < 0) {
        return qk_error_set_errno(err, (int)len, "Could not get file size");
    }
    *file_len = (uint64_t)len;
    uint8_t b[QCOW2_HEADER_WRITE_LEN];
    memset(b, 0, sizeof(b));
    if ((uint64_t)len < QCOW2_HEADER_V2_LEN) {
        return qk_error_corrupt(err, "header is truncated (file is %lld bytes)", (long long)len);
    }
    uint64_t n = QK_MIN((uint64_t)len, (uint64_t)sizeof(b));
    int r = qk_co_pread(file, 0, n, b, 0);
    if (r < 0) {
        return qk_error_set_errno(err, r, "Could not read qcow2 header");
    }
    memset(h, 0, sizeof(*h));
    h->magic = qk_be32_get(b);
    h->version = qk_be32_get(b + 4);
    if (h->magic != QCOW2_MAGIC) {
        return qk_error_set(err, -EINVAL, "Image is not in qcow2 format");
    }
    if (h->version == 1) {
        return qk_error_set(err, -ENOTSUP, "QCOW version 1 images are not supported "
                            "('qemu-img convert -O qcow2' makes a qcow2 copy)");
    }
    if (h->version < 2 || h->version > 3) {
        return qk_error_set(err, -ENOTSUP, "Unsupported qcow2 version %u", h->version);
    }
    h->backing_file_offset = qk_be64_get(b + 8);
    h->backing_file_size = qk_be32_get(b + 16);
    h->cluster_bits = qk_be32_get(b + 20);
    h->size = qk_be64_get(b + 24);
    h->crypt_method = qk_be32_get(b + 32);
    h->l1_size = qk_be32_get(b + 36);
    h->l1_table_offset = qk_be64_get(b + 40);
    h->refcount_table_offset = qk_be64_get(b + 48);
    h->refcount_table_clusters = qk_be32_get(b + 56);
    h->nb_snapshots = qk_be32_get(b + 60);
    h->snapshots_offset = qk_be64_get(b + 64);
    if (h->version == 2) {
        h->refcount_order = 4;
        h->header_length = QCOW2_HEADER_V2_LEN;
    } else {
        if ((uint64_t)len < QCOW2_HEADER_V3_LEN) {
            return qk_error_corrupt(err, "header is truncated (file is %lld bytes)", (long long)len);
        }
        h->incompatible_features = qk_be64_get(b + 72);
        h->compatible_features = qk_be64_get(b + 80);
        h->autoclear_features = qk_be64_get(b + 88);
        h->refcount_order = qk_be32_get(b + 96);
        h->header_length = qk_be32_get(b + 100);
        if (h->header_length < QCOW2_HEADER_V3_LEN) {
            return qk_error_corrupt(err, "header_length %u is too small", h->header_length);
        }
        if (h->header_length > 104) {
            if ((uint64_t)len < 105) {
                return qk_error_corrupt(err, "header is truncated");
            }
            h->compression_type = b[104];
        }
    }
    if (h->cluster_bits < QCOW2_MIN_CLUSTER_BITS || h->cluster_bits > QCOW2_MAX_CLUSTER_BITS) {
        return qk_error_corrupt(err, "cluster_bits %u is out of range (%d..%d)", h->cluster_bits,
                                QCOW2_MIN_CLUSTER_BITS, QCOW2_MAX_CLUSTER_BITS);
    }
    uint64_t cs = 1ULL << h->cluster_bits;
    if (h->header_length > cs) {
        return qk_error_corrupt(err, "header_length %u exceeds the cluster size", h->header_length);
    }
    /* Cluster 0 holds the header, its extensions and the backing name. */
    uint64_t c0len = QK_MIN(cs, (uint64_t)len);
    uint8_t *c0 = calloc(1, cs);
    if (!c0) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    r = qk_co_pread(file, 0, c0len, c0, 0);
    if (r < 0) {
        free(c0);
        return qk_error_set_errno(err, r, "Could not read qcow2 header");
    }
    *cluster0 = c0;
    return 0;
}

/* Lists names of the bits in `bits` of feature `type`, from the image's
 * own feature table when it has one, then from ours. */
static void feature_list(const Qcow2State *s, int type, uint64_t bits, char *out, size_t outlen)
{
    size_t n = 0;
    out[0] = 0;
    for (int bit = 0; bit < 64; bit++) {
        if (!(bits & (1ULL << bit))) {
            continue;
        }
        char name[47] = "";
        for (uint32_t i = 0; s->feature_table && i + 48 <= s->feature_table_len; i += 48) {
            const uint8_t *e = s->feature_table + i;
            if (e[0] == type && e[1] == bit) {
                memcpy(name, e + 2, 46);
                name[46] = 0;
                break;
            }
        }
        for (size_t i = 0; !name[0] && i < QK_ARRAY_SIZE(feature_names); i++) {
            if (feature_names[i].type == type && feature_names[i].bit == bit) {
                snprintf(name, sizeof(name), "%s", feature_names[i].name);
            }
        }
        if (!name[0]) {
            snprintf(name, sizeof(name), "Unknown incompatible feature: %llx", 1ULL << bit);
        }
        int w = snprintf(out + n, outlen - n, "%s%s", n ? ", " : "", name);
        if (w < 0 || (size_t)w >= outlen - n) {
            return;
        }
        n += (size_t)w;
    }
}

/* Checks that a table of `bytes` at `off` is cluster aligned, inside the
 * file and clear of the header cluster. */
static int check_table(Qcow2State *s, const char *what, uint64_t off, uint64_t bytes,
                       uint64_t file_len, QkError *err)
{
    if (bytes == 0) {
        return 0;
    }
    if (!qk_is_aligned(off, s->cluster_size)) {
        return qk_error_corrupt(err, "%s offset %#llx is not cluster aligned", what, (unsigned long long)off);
    }
    if (off < s->cluster_size) {
        return qk_error_corrupt(err, "%s overlaps the image header", what);
    }
    if (!qk_range_within(off, bytes, file_len)) {
        return qk_error_corrupt(err, "%s (offset %#llx, %llu bytes) lies past the end of the file",
                                what, (unsigned long long)off, (unsigned long long)bytes);
    }
    return 0;
}

int qcow2_validate_header(Qcow2State *s, uint64_t file_len, bool rdwr, bool l1_may_be_lost, bool metadata_only,
                          QkError *err)
{
    Qcow2Header *h = &s->h;
    s->cluster_bits = h->cluster_bits;
    s->cluster_size = 1ULL << h->cluster_bits;
    /* Only described (info); reading or writing needs the key. */
    if (h->crypt_method != 0 && (rdwr || !metadata_only)) {
        return qk_error_set(err, -ENOTSUP, "encrypted images are not supported");
    }
    uint64_t unknown = h->incompatible_features & ~QCOW2_INCOMPAT_KNOWN;
    if (unknown) {
        char names[400];
        feature_list(s, 0, unknown, names, sizeof(names));
        return qk_error_set(err, -ENOTSUP, "Unsupported qcow2 feature(s): %s", names);
    }
    /* rdwr is false for check -r: repairing is how the bit is cleared. */
    if ((h->incompatible_features & QCOW2_INCOMPAT_CORRUPT) && rdwr) {
        return qk_error_set(err, -EACCES, "qcow2: Image is corrupt; cannot be opened read/write");
    }
    if (h->refcount_order > 6) {
        return qk_error_corrupt(err, "refcount_order %u is out of range (0..6)", h->refcount_order);
    }
    if (h->compression_type > 1) {
        return qk_error_set(err, -ENOTSUP, "Unknown compression type %u", h->compression_type);
    }
    if ((h->compression_type != 0) != !!(h->incompatible_features & QCOW2_INCOMPAT_COMPRESSION)) {
        return qk_error_corrupt(err, "compression type %u does not match the compression type feature bit",
                                h->compression_type);
    }
    s->extended_l2 = (h->incompatible_features & QCOW2_INCOMPAT_EXTL2) != 0;
    if (s->extended_l2 && h->cluster_bits < 14) {
        return qk_error_corrupt(err, "extended L2 entries need clusters of at least 16 KiB");
    }
    s->l2_entry_size = s->extended_l2 ? 16 : 8;
    s->l2_bits = h->cluster_bits - (s->extended_l2 ? 4 : 3);
    s->l2_entries = 1ULL << s->l2_bits;
    s->sc_per_cluster = s->extended_l2 ? 32 : 1;
    s->sc_bits = h->cluster_bits - (s->extended_l2 ? 5 : 0);
    s->sc_size = 1ULL << s->sc_bits;
    s->refcount_order = h->refcount_order;
    s->refcount_bits = 1U << h->refcount_order;
    s->refcount_max = s->refcount_bits == 64 ? (uint64_t)INT64_MAX : (1ULL << s->refcount_bits) - 1;
    s->rb_bits = h->cluster_bits + 3 - h->refcount_order;
    s->lazy_refcounts = (h->compatible_features & QCOW2_COMPAT_LAZY_REFCOUNTS) != 0;

    if (h->size > (1ULL << 62)) {
        return qk_error_corrupt(err, "virtual size %llu is too large", (unsigned long long)h->size);
    }
    uint64_t l1_bytes = (uint64_t)h->l1_size * 8;
    if (l1_bytes > QCOW2_MAX_L1_BYTES) {
        return qk_error_corrupt(err, "active L1 table too large (%u entries)", h->l1_size);
    }
    if (h->l1_size < qcow2_l1_needed(s, h->size)) {
        return qk_error_corrupt(err, "L1 table is too small (%u entries) for the virtual size", h->l1_size);
    }
    int r;
    if (l1_may_be_lost && l1_bytes && qk_is_aligned(h->l1_table_offset, s->cluster_size) &&
        h->l1_table_offset >= s->cluster_size && !qk_range_within(h->l1_table_offset, l1_bytes, file_len)) {
        /* Past the end of the file: a read-only check (or info, which
         * reads no guest data) reads it as zeros, as qemu-img does, to
         * report what else is wrong. Nothing else opens it: a writer would
         * place new clusters under it, qemu-img's repair frees what the
         * lost table referenced, and a reader would take the lost data for
         * zeros. */
        s->l1_past_eof = true;
    } else {
        r = check_table(s, "L1 table", h->l1_table_offset, l1_bytes, file_len, err);
        if (r < 0) {
            return r;
        }
    }
    if (h->refcount_table_clusters == 0) {
        return qk_error_corrupt(err, "refcount table is empty");
    }
    uint64_t rt_bytes = (uint64_t)h->refcount_table_clusters << h->cluster_bits;
    if (rt_bytes > QCOW2_MAX_REFTABLE_BYTES) {
        return qk_error_corrupt(err, "refcount table too large (%u clusters)", h->refcount_table_clusters);
    }
    r = check_table(s, "refcount table", h->refcount_table_offset, rt_bytes, file_len, err);
    if (r < 0) {
        return r;
    }
    if (qk_ranges_overlap(h->l1_table_offset, l1_bytes, h->refcount_table_offset, rt_bytes)) {
        return qk_error_corrupt(err, "L1 table and refcount table overlap");
    }
    if (h->nb_snapshots > QCOW2_MAX_SNAPSHOTS) {
        return qk_error_corrupt(err, "too many snapshots (%u)", h->nb_snapshots);
    }
    if (h->nb_snapshots) {
        /* Each entry is at least 40 bytes; the exact size is checked when read. */
        uint64_t sn_min = (uint64_t)h->nb_snapshots * 40;
        /* A file cut short loses the table first: it is written at the
         * end when a snapshot is taken. Read-only, the active image can
         * still be read (and copied out); check reports the table and
         * check -r all drops it (repair.c). The snapshot commands fail
         * when they read it; a writer is refused here. */
        bool lost = !rdwr && qk_is_aligned(h->snapshots_offset, s->cluster_size) &&
                    h->snapshots_offset >= s->cluster_size &&
                    !qk_range_within(h->snapshots_offset, sn_min, file_len);
        r = lost ? 0 : check_table(s, "snapshot table", h->snapshots_offset, sn_min, file_len, err);
        if (r < 0) {
            return r;
        }
    }
    if (h->backing_file_offset) {
        if (h->backing_file_size > QCOW2_MAX_BACKING_NAME) {
            return qk_error_corrupt(err, "backing file name too long (%u bytes)", h->backing_file_size);
        }
        if (!qk_range_within(h->backing_file_offset, h->backing_file_size, s->cluster_size) ||
            h->backing_file_offset < h->header_length) {
            return qk_error_corrupt(err, "invalid backing file name offset %#llx",
                                    (unsigned long long)h->backing_file_offset);
        }
        if (!qk_range_within(h->backing_file_offset, h->backing_file_size, file_len)) {
            return qk_error_corrupt(err, "backing file name lies past the end of the file");
        }
    }
    return 0;
}

int qcow2_parse_extensions(Qcow2State *s, const uint8_t *c0, char **backing_fmt, QkError *err)
{
    const Qcow2Header *h = &s->h;
    uint64_t pos = h->header_length;
    /* Extensions end before the backing name, or at the end of cluster 0.
     * This runs before qcow2_validate_header (whose messages use the
     * feature table found here), so the backing name offset is still
     * unchecked: never look past cluster 0, which is all c0 holds. */
    uint64_t end = h->backing_file_offset ? QK_MIN(h->backing_file_offset, s->cluster_size) : s->cluster_size;
    Qcow2Ext **tail = &s->exts;
    unsigned count = 0;
    *backing_fmt = NULL;
    while (pos < end) {
        /* Even the end marker must fit, length and all, as QEMU refuses
         * one that runs into the backing file name. */
        if (end - pos < 8) {
            return qk_error_corrupt(err, "a header extension at %#" PRIx64 " overruns the header area", pos);
        }
        uint32_t type = qk_be32_get(c0 + pos);
        uint32_t len = qk_be32_get(c0 + pos + 4);
        pos += 8;
        if (!qk_range_within(pos, len, end)) {
            return qk_error_corrupt(err, "header extension %#x (%u bytes) overruns the header area", type, len);
        }
        if (type == QCOW2_EXT_END) {
            break;
        }
        if (++count > QCOW2_MAX_HEADER_EXTENSIONS) {
            /* A 2 MiB header cluster holds 262144 empty ones, each kept. */
            return qk_error_corrupt(err, "too many header extensions (more than %d): the list never ends",
                                    QCOW2_MAX_HEADER_EXTENSIONS);
        }
        Qcow2Ext *e = calloc(1, sizeof(*e));
        if (!e || !(e->data = malloc(len ? len : 1))) {
            free(e);
            return qk_error_set(err, -ENOMEM, "out of memory");
        }
        e->type = type;
        e->len = len;
        memcpy(e->data, c0 + pos, len);
        *tail = e;
        tail = &e->next;
        if (type == QCOW2_EXT_BACKING_FORMAT) {
            if (len >= 16) {
                /* QEMU keeps format names in 16 bytes and refuses longer. */
                return qk_error_corrupt(err, "backing format name too long (%u bytes; at most 15)", len);
            }
            free(*backing_fmt);
            *backing_fmt = strndup((const char *)e->data, len);
        } else if (type == QCOW2_EXT_FEATURE_TABLE) {
            s->feature_table = e->data;
            s->feature_table_len = len;
        }
        pos += qk_align_up(len, 8);
    }
    return 0;
}

void qcow2_free_extensions(Qcow2State *s)
{
    while (s->exts) {
        Qcow2Ext *e = s->exts;
        s->exts = e->next;
        free(e->data);
        free(e);
    }
    s->feature_table = NULL;
}

/* Rewrites header bytes [off, off+len) from the in-memory header. Only
 * fields that exist in this header's version are ever passed. */
int coroutine_fn qcow2_write_header_field(Qcow2State *s, unsigned off, unsigned len)
{
    uint8_t b[QCOW2_HEADER_WRITE_LEN];
    if (s->read_only) {
        return -EACCES;
    }
    if (off + len > s->h.header_length) {
        return -EINVAL;
    }
    qcow2_header_to_be(&s->h, b);
    return qk_co_pwrite(s->bs->file, off, len, b + off, QK_REQ_KIND(QK_IO_HEADER));
}

int coroutine_fn qcow2_set_incompat(Qcow2State *s, uint64_t incompat)
{
    if (!qcow2_is_v3(s)) {
        return 0;
    }
    uint64_t old = s->h.incompatible_features;
    s->h.incompatible_features = incompat;
    int r = qcow2_write_header_field(s, QCOW2_HOFF_INCOMPAT, 8);
    if (r < 0) {
        s->h.incompatible_features = old;
    }
    return r;
}

static int put_ext(uint8_t *buf, size_t buflen, size_t *pos, uint32_t type, const void *data, uint32_t len)
{
    size_t need = 8 + qk_align_up(len, 8);
    if (*pos + need > buflen) {
        return -1;
    }
    qk_be32_put(buf + *pos, type);
    qk_be32_put(buf + *pos + 4, len);
    memset(buf + *pos + 8, 0, qk_align_up(len, 8));
    if (len) {
        memcpy(buf + *pos + 8, data, len);
    }
    *pos += need;
    return 0;
}

/* The feature name table QEMU writes into v3 headers. */
static int put_feature_table(uint8_t *buf, size_t buflen, size_t *pos)
{
    uint8_t table[QK_ARRAY_SIZE(feature_names) * 48];
    memset(table, 0, sizeof(table));
    for (size_t i = 0; i < QK_ARRAY_SIZE(feature_names); i++) {
        table[i * 48] = feature_names[i].type;
        table[i * 48 + 1] = feature_names[i].bit;
        memcpy(table + i * 48 + 2, feature_names[i].name, strlen(feature_names[i].name));
    }
    return put_ext(buf, buflen, pos, QCOW2_EXT_FEATURE_TABLE, table, sizeof(table));
}

int qcow2_build_header(const Qcow2Header *hin, const char *backing, const char *backing_fmt,
                       const char *data_file, uint8_t *buf, size_t buflen, QkError *err)
{
    Qcow2Header h = *hin;
    memset(buf, 0, buflen);
    size_t pos = h.version >= 3 ? QCOW2_HEADER_WRITE_LEN : QCOW2_HEADER_V2_LEN;
    h.header_length = h.version >= 3 ? QCOW2_HEADER_WRITE_LEN : 0;
    int bad = 0;
    if (backing_fmt) {
        bad |= put_ext(buf, buflen, &pos, QCOW2_EXT_BACKING_FORMAT, backing_fmt, (uint32_t)strlen(backing_fmt));
    }
    if (data_file) {
        bad |= put_ext(buf, buflen, &pos, QCOW2_EXT_DATA_FILE, data_file, (uint32_t)strlen(data_file));
    }
    /* Like qemu-img, leave small header clusters room for a long backing
     * file name instead of the (optional) feature name table. */
    if (h.version >= 3 && buflen > 4096) {
        bad |= put_feature_table(buf, buflen, &pos);
    }
    if (backing_fmt || data_file || h.version >= 3) {
        bad |= put_ext(buf, buflen, &pos, QCOW2_EXT_END, NULL, 0);
    }
    if (bad) {
        return qk_error_set(err, -EINVAL, "header extensions do not fit in one cluster");
    }
    if (backing) {
        size_t bl = strlen(backing);
        if (bl > QCOW2_MAX_BACKING_NAME || pos + bl > buflen) {
            return qk_error_set(err, -EINVAL, "backing file name too long");
        }
        h.backing_file_offset = pos;
        h.backing_file_size = (uint32_t)bl;
        memcpy(buf + pos, backing, bl);
    }
    uint8_t hb[QCOW2_HEADER_WRITE_LEN];
    qcow2_header_to_be(&h, hb);
    memcpy(buf, hb, h.version >= 3 ? QCOW2_HEADER_WRITE_LEN : QCOW2_HEADER_V2_LEN);
    return 0;
}

/* Lays out the extension area from `pos` on: the backing format (new),
 * every other extension as read (unknown ones too; the feature table
 * only in a v3 header, added there when missing as QEMU does), the end
 * marker, then the backing file name. -ENOSPC when it does not fit in
 * cluster 0. */
static int layout_backing(Qcow2State *s, uint8_t *c0, size_t pos, uint32_t version, const char *name,
                          const char *fmt)
{
    size_t len = s->cluster_size;
    memset(c0 + pos, 0, len - pos);
    int bad = 0;
    bool table = false;
    if (fmt) {
        bad |= put_ext(c0, len, &pos, QCOW2_EXT_BACKING_FORMAT, fmt, (uint32_t)strlen(fmt));
    }
    for (Qcow2Ext *e = s->exts; e; e = e->next) {
        if (e->type == QCOW2_EXT_BACKING_FORMAT || (e->type == QCOW2_EXT_FEATURE_TABLE && version < 3)) {
            continue;
        }
        table |= e->type == QCOW2_EXT_FEATURE_TABLE;
        bad |= put_ext(c0, len, &pos, e->type, e->data, e->len);
    }
    if (version >= 3 && !table && s->h.version < 3 && len > 4096) {
        bad |= put_feature_table(c0, len, &pos);
    }
    bad |= put_ext(c0, len, &pos, QCOW2_EXT_END, NULL, 0);
    size_t nl = name ? strlen(name) : 0;
    if (bad || pos + nl > len) {
        return -ENOSPC;
    }
    qk_be64_put(c0 + 8, nl ? pos : 0);
    qk_be32_put(c0 + 16, (uint32_t)nl);
    if (nl) {
        /* Not memcpy(..., NULL, 0): the compiler may then assume name is
         * never NULL and drop the caller's checks of it. */
        memcpy(c0 + pos, name, nl);
    }
    return 0;
}

/* Rewrites cluster 0 in one write (then flushes): header fields from nh
 * (NULL: as they are, bytes past the known fields kept), the extensions
 * re-laid for nh's version, and name/fmt as the backing file. Updates
 * the in-memory header and extension list to match. */
static int coroutine_fn rewrite_cluster0(QkBlock *bs, const Qcow2Header *nh, const char *name, const char *fmt,
                                         QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (s->read_only) {
        return qk_error_set(err, -EACCES, "the image is read-only");
    }
    if (name && strlen(name) > QCOW2_MAX_BACKING_NAME) {
        return qk_error_set(err, -EINVAL, "backing file name too long");
    }
    if (!name) {
        fmt = NULL;
    }
    uint8_t *c0 = qk_aligned_alloc(qk_block_buf_align(bs->file), s->cluster_size);
    if (!c0) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    Qcow2Header h = nh ? *nh : s->h;
    if (h.version < 3) {
        h.header_length = QCOW2_HEADER_V2_LEN;
    } else if (nh && s->h.version < 3) {
        h.header_length = QCOW2_HEADER_WRITE_LEN;
    }
    qk_co_mutex_lock(&s->lock);
    /* The header fields and any bytes past the ones this version knows
     * (up to header_length) are taken from the file as they are. */
    int r = qk_co_pread(bs->file, 0, s->cluster_size, c0, QK_REQ_KIND(QK_IO_HEADER));
    if (r == 0 && nh) {
        uint8_t hb[QCOW2_HEADER_WRITE_LEN];
        qcow2_header_to_be(&h, hb);
        memcpy(c0, hb, QK_MIN(h.header_length, (uint32_t)QCOW2_HEADER_WRITE_LEN));
    }
    if (r == 0) {
        r = layout_backing(s, c0, h.header_length, h.version, name, fmt);
        if (r < 0) {
            qk_error_set_errno(err, r, "the header extensions and backing file name do not fit in the first cluster");
        }
    } else {
        qk_error_set_errno(err, r, "Could not read the header");
    }
    /* One write of the header cluster, as QEMU makes it: whatever it
     * points to (data a safe rebase copied, clusters a downgrade
     * expanded) was flushed by the caller first. */
    if (r == 0) {
        r = qk_co_pwrite(bs->file, 0, s->cluster_size, c0, QK_REQ_KIND(QK_IO_HEADER));
        if (r < 0) {
            qk_error_set_errno(err, qcow2_fence(s, r), "Could not write the header");
        }
    }
    if (r == 0) {
        r = qk_co_flush(bs->file);
        if (r < 0) {
            qk_error_set_errno(err, qcow2_fence(s, r), "Could not flush the header");
        }
    }
    if (r == 0) {
        h.backing_file_offset = qk_be64_get(c0 + 8);
        h.backing_file_size = qk_be32_get(c0 + 16);
        s->h = h;
        char *n = name ? strdup(name) : NULL, *f = fmt ? strdup(fmt) : NULL, *pf = NULL;
        /* The extension list is read back from what was written. */
        qcow2_free_extensions(s);
        QkError perr = {0};
        if ((name && !n) || (fmt && !f) || qcow2_parse_extensions(s, c0, &pf, &perr) < 0) {
            /* On disk it is done; only the in-memory copy is stale,
             * and no write may go by it. */
            free(n);
            free(f);
            r = qk_error_set(err, qcow2_fence(s, -ENOMEM), "out of memory");
        } else {
            free(bs->backing_file);
            free(bs->backing_format);
            bs->backing_file = n;
            bs->backing_format = f;
        }
        free(pf);
    }
    qk_co_mutex_unlock(&s->lock);
    free(c0);
    return r;
}

int coroutine_fn qcow2_co_change_backing(QkBlock *bs, const char *name, const char *fmt, QkError *err)
{
    return rewrite_cluster0(bs, NULL, name, fmt, err);
}

int coroutine_fn qcow2_co_rewrite_header(QkBlock *bs, const Qcow2Header *nh, QkError *err)
{
    return rewrite_cluster0(bs, nh, bs->backing_file, bs->backing_format, err);
}
