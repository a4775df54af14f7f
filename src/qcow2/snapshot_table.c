/*
 * The qcow2 snapshot table: parsing it (every length checked against the
 * file and QEMU's limits before use), serialising it with the extra data
 * (64-bit VM state size, disk size, icount; unknown extra bytes kept), and
 * replacing it crash-safely: new table first, then the header, then the old
 * table is freed. Ids and names follow QEMU: ids are numbers handed out as
 * one more than the largest, lookups by id or by name.
 */
#include "qcow2/snapshot_int.h"

#include <stdlib.h>
#include <string.h>

void qcow2_snapshots_free(Qcow2Snapshot *sn, uint32_t n)
{
    for (uint32_t i = 0; sn && i < n; i++) {
        free(sn[i].id);
        free(sn[i].name);
        free(sn[i].extra_unknown);
    }
    free(sn);
}

/* Parses one entry's variable part (extra data, id, name) from buf. */
static int parse_entry(Qcow2State *s, const uint8_t *fixed, const uint8_t *var, Qcow2Snapshot *sn,
                       uint32_t extra, uint16_t id_len, uint16_t name_len)
{
    sn->l1_offset = qk_be64_get(fixed);
    sn->l1_size = qk_be32_get(fixed + 8);
    sn->date_sec = qk_be32_get(fixed + 16);
    sn->date_nsec = qk_be32_get(fixed + 20);
    sn->vm_clock_nsec = qk_be64_get(fixed + 24);
    sn->vm_state_size = qk_be32_get(fixed + 32);
    /* Entries without the extra fields predate them: the disk had the
     * image's current size and no instruction count was kept. */
    sn->disk_size = s->h.size;
    sn->icount = -1;
    if (extra >= 8) {
        sn->vm_state_size = qk_be64_get(var);
    }
    if (extra >= 16) {
        sn->disk_size = qk_be64_get(var + 8);
    }
    if (extra >= 24) {
        sn->icount = (int64_t)qk_be64_get(var + 16);
    }
    if (extra > QCOW2_SN_EXTRA_KNOWN) {
        sn->extra_unknown_len = extra - QCOW2_SN_EXTRA_KNOWN;
        sn->extra_unknown = malloc(sn->extra_unknown_len);
        if (!sn->extra_unknown) {
            return -ENOMEM;
        }
        memcpy(sn->extra_unknown, var + QCOW2_SN_EXTRA_KNOWN, sn->extra_unknown_len);
    }
    sn->id = strndup((const char *)var + extra, id_len);
    sn->name = strndup((const char *)var + extra + id_len, name_len);
    return sn->id && sn->name ? 0 : -ENOMEM;
}

static int coroutine_fn read_table(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                   uint32_t *capped, bool lenient, QkError *err)
{
    *out = NULL;
    *n = 0;
    if (table_len) {
        *table_len = 0;
    }
    uint32_t nb = s->h.nb_snapshots;
    if (nb == 0) {
        return 0;
    }
    int64_t flen = qk_block_length(s->bs->file);
    if (flen < 0) {
        return qk_error_set_errno(err, (int)flen, "Could not get file size");
    }
    Qcow2Snapshot *sn = calloc(nb, sizeof(*sn));
    /* One entry's variable part is at most extra + two 16-bit strings + pad. */
    uint8_t *var = malloc(QCOW2_SN_MAX_EXTRA + 2 * 65536 + 8);
    if (!sn || !var) {
        free(sn);
        free(var);
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    uint64_t off = s->h.snapshots_offset, pos = off, claim_end = off;
    uint64_t l1_total = 0;  /* bytes of all snapshot L1 tables */
    int r = 0;
    uint32_t i;
    for (i = 0; i < nb; i++) {
        uint8_t fixed[QCOW2_SN_FIXED_LEN];
        /* Where the table claims to end (this entry, then the fixed part
         * of each one left): what a lenient reader protects when it
         * cannot read the table, as QEMU reads the part past the end of
         * the file as zeros and protects all of it. */
        claim_end = pos + QCOW2_SN_FIXED_LEN * (uint64_t)(nb - i);
        if (!qk_range_within(pos, sizeof(fixed), (uint64_t)flen)) {
            r = i == 0 && off >= (uint64_t)flen
                    ? qk_error_corrupt(err, "snapshot table (offset %#llx) lies past the end of the file",
                                       (unsigned long long)off)
                    : qk_error_corrupt(err, "snapshot table is truncated");
            break;
        }
        r = qk_co_pread(s->bs->file, pos, sizeof(fixed), fixed, 0);
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not read the snapshot table");
            break;
        }
        uint16_t id_len = qk_be16_get(fixed + 12), name_len = qk_be16_get(fixed + 14);
        uint32_t extra = qk_be32_get(fixed + 36), disk_extra = extra;
        if (extra > QCOW2_SN_MAX_EXTRA && !capped) {
            r = qk_error_corrupt(err, "snapshot %u has too much extra data (%u bytes)", i, extra);
            break;
        }
        uint64_t var_len = (uint64_t)disk_extra + id_len + name_len;
        uint64_t ent_len = qk_align_up(QCOW2_SN_FIXED_LEN + var_len, 8);
        claim_end += var_len;
        /* The last entry's padding need not be in the file: qemu-img ends
         * a table at the end of the file right after the last name. */
        if (!qk_range_within(pos, QCOW2_SN_FIXED_LEN + var_len, (uint64_t)flen) ||
            pos + ent_len - off > QCOW2_MAX_SNAPSHOT_TABLE_BYTES) {
            r = qk_error_corrupt(err, "snapshot table is truncated or too large");
            break;
        }
        if (extra > QCOW2_SN_MAX_EXTRA) {
            /* The first bytes are kept; the id and name follow all of them. */
            extra = QCOW2_SN_MAX_EXTRA;
            sn[i].extra_dropped = disk_extra;
            (*capped)++;
            r = qk_co_pread(s->bs->file, pos + QCOW2_SN_FIXED_LEN, extra, var, 0);
            if (r == 0 && id_len + name_len) {
                r = qk_co_pread(s->bs->file, pos + QCOW2_SN_FIXED_LEN + disk_extra, id_len + name_len, var + extra, 0);
            }
        } else if (var_len) {
            r = qk_co_pread(s->bs->file, pos + QCOW2_SN_FIXED_LEN, var_len, var, 0);
        }
        if (r < 0) {
            qk_error_set_errno(err, r, "Could not read the snapshot table");
            break;
        }
        r = parse_entry(s, fixed, var, &sn[i], extra, id_len, name_len);
        sn[i].incomplete = qcow2_is_v3(s) && disk_extra < 16;
        if (r < 0) {
            qk_error_set(err, r, "out of memory");
            break;
        }
        if ((uint64_t)sn[i].l1_size * 8 > QCOW2_MAX_L1_BYTES ||
            !qk_is_aligned(sn[i].l1_offset, s->cluster_size) ||
            (sn[i].l1_size && !qk_range_within(sn[i].l1_offset, (uint64_t)sn[i].l1_size * 8, (uint64_t)flen))) {
            if (lenient) {
                sn[i].l1_bad = true; /* never read, so not counted below */
                pos += ent_len;
                continue;
            }
            r = qk_error_corrupt(err, "snapshot '%s' has an invalid L1 table", sn[i].name);
            i++;
            break;
        }
        /* Each snapshot has its own L1 copy, so together they fit in the
         * file; a hostile table naming one huge L1 table many times would
         * otherwise make every walk over the snapshots read it again. */
        l1_total += qk_align_up((uint64_t)sn[i].l1_size * 8, s->cluster_size);
        if (l1_total > (uint64_t)flen) {
            r = qk_error_corrupt(err, "the snapshots' L1 tables (%llu bytes up to snapshot '%s') "
                                 "do not fit in the file", (unsigned long long)l1_total, sn[i].name);
            i++;
            break;
        }
        pos += ent_len;
    }
    free(var);
    if (r < 0) {
        qcow2_snapshots_free(sn, QK_MIN(i + 1, nb));
        if (lenient && table_len) {
            *table_len = claim_end - off;
        }
        return r;
    }
    *out = sn;
    *n = nb;
    if (table_len) {
        *table_len = pos - off;
    }
    return 0;
}

int coroutine_fn qcow2_snapshots_read(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                      QkError *err)
{
    return read_table(s, out, n, table_len, NULL, false, err);
}

int coroutine_fn qcow2_snapshots_read_lenient(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                              QkError *err)
{
    return read_table(s, out, n, table_len, NULL, true, err);
}

int coroutine_fn qcow2_snapshots_read_capped(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                             uint32_t *capped, QkError *err)
{
    *capped = 0;
    return read_table(s, out, n, table_len, capped, false, err);
}

static uint32_t extra_len(const Qcow2Snapshot *sn)
{
    return QCOW2_SN_EXTRA_KNOWN + sn->extra_unknown_len;
}

static uint64_t entry_len(const Qcow2Snapshot *sn)
{
    return qk_align_up(QCOW2_SN_FIXED_LEN + (uint64_t)extra_len(sn) + strlen(sn->id) + strlen(sn->name), 8);
}

static void encode_entry(const Qcow2Snapshot *sn, uint8_t *p)
{
    size_t id_len = strlen(sn->id), name_len = strlen(sn->name);
    uint32_t extra = extra_len(sn);
    qk_be64_put(p, sn->l1_offset);
    qk_be32_put(p + 8, sn->l1_size);
    qk_be16_put(p + 12, (uint16_t)id_len);
    qk_be16_put(p + 14, (uint16_t)name_len);
    qk_be32_put(p + 16, sn->date_sec);
    qk_be32_put(p + 20, sn->date_nsec);
    qk_be64_put(p + 24, sn->vm_clock_nsec);
    /* Old readers see the 32-bit field; a state too big for it is only
     * described by the 64-bit one. */
    qk_be32_put(p + 32, sn->vm_state_size > UINT32_MAX ? 0 : (uint32_t)sn->vm_state_size);
    qk_be32_put(p + 36, extra);
    qk_be64_put(p + 40, sn->vm_state_size);
    qk_be64_put(p + 48, sn->disk_size);
    qk_be64_put(p + 56, (uint64_t)sn->icount);
    if (sn->extra_unknown_len) {
        memcpy(p + 64, sn->extra_unknown, sn->extra_unknown_len);
    }
    memcpy(p + QCOW2_SN_FIXED_LEN + extra, sn->id, id_len);
    memcpy(p + QCOW2_SN_FIXED_LEN + extra + id_len, sn->name, name_len);
}

int coroutine_fn qcow2_snapshots_write(Qcow2State *s, const Qcow2Snapshot *sn, uint32_t n, QkError *err)
{
    if (n > QCOW2_MAX_SNAPSHOTS) {
        return qk_error_set(err, -EFBIG, "Too many snapshots");
    }
    uint64_t len = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (strlen(sn[i].id) > UINT16_MAX || strlen(sn[i].name) > UINT16_MAX) {
            return qk_error_set(err, -EINVAL, "snapshot id or name too long");
        }
        len += entry_len(&sn[i]);
    }
    if (len > QCOW2_MAX_SNAPSHOT_TABLE_BYTES) {
        return qk_error_set(err, -EFBIG, "Snapshot table too large");
    }
    uint64_t nclusters = QK_DIV_ROUND_UP(len, s->cluster_size);
    uint8_t *buf = NULL;
    int64_t off = 0;
    int r = 0;
    if (n) {
        buf = qk_aligned_zalloc(qk_block_buf_align(s->bs), nclusters * s->cluster_size);
        if (!buf) {
            return qk_error_set(err, -ENOMEM, "out of memory");
        }
        uint64_t p = 0;
        for (uint32_t i = 0; i < n; i++) {
            encode_entry(&sn[i], buf + p);
            p += entry_len(&sn[i]);
        }
        off = qcow2_alloc_clusters(s, nclusters);
        r = off < 0 ? (int)off : 0;
        if (r == 0) {
            r = qcow2_co_write_new_meta(s, (uint64_t)off, nclusters * s->cluster_size, buf, 0,
                                        QK_REQ_KIND(QK_IO_SNAPSHOT));
        }
    }
    free(buf);
    /* The table and its refcounts must be stable before the header names it. */
    if (r == 0) {
        r = qcow2_flush_caches(s);
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    uint32_t old_nb = s->h.nb_snapshots;
    uint64_t old_off = s->h.snapshots_offset;
    uint64_t old_len = 0;
    if (r == 0 && old_nb) {
        Qcow2Snapshot *old;
        uint32_t on;
        QkError e2 = {0};
        uint32_t capped;
        /* Unreadable old table: leak it rather than fail the update. */
        if (qcow2_snapshots_read_capped(s, &old, &on, &old_len, &capped, &e2) == 0) {
            qcow2_snapshots_free(old, on);
        }
    }
    if (r == 0) {
        s->h.nb_snapshots = n;
        s->h.snapshots_offset = n ? (uint64_t)off : 0;
        r = qcow2_write_header_field(s, QCOW2_HOFF_SNAPSHOTS, 12);
        if (r < 0) {
            s->h.nb_snapshots = old_nb;
            s->h.snapshots_offset = old_off;
            qcow2_fence(s, r);
        }
    }
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
        if (r < 0) {
            qcow2_fence(s, r);
        }
    }
    if (r < 0) {
        if (off > 0 && s->h.snapshots_offset != (uint64_t)off) {
            qcow2_free_clusters(s, (uint64_t)off, nclusters * s->cluster_size);
        }
        return qk_error_set_errno(err, r, "Could not write the snapshot table");
    }
    /* Protected from now on; the old table's clusters are not. */
    qcow2_meta_set_snapshots(s, sn, n, (uint64_t)off, len);
    if (old_len) {
        r = qcow2_free_clusters(s, old_off, old_len);
        if (r < 0) {
            return qk_error_set_errno(err, r, "Could not free the old snapshot table");
        }
    }
    return 0;
}

int coroutine_fn qcow2_snapshots_cut(Qcow2State *s, uint32_t keep, QkError *err)
{
    uint32_t old_nb = s->h.nb_snapshots;
    uint64_t old_off = s->h.snapshots_offset;
    s->h.nb_snapshots = keep;
    s->h.snapshots_offset = keep ? old_off : 0;
    int r = qcow2_write_header_field(s, QCOW2_HOFF_SNAPSHOTS, 12);
    if (r == 0) {
        r = qk_co_flush(s->bs->file);
    }
    if (r < 0) {
        s->h.nb_snapshots = old_nb;
        s->h.snapshots_offset = old_off;
        return qk_error_set_errno(err, qcow2_fence(s, r), "Could not write the header");
    }
    /* The overlap check protected all the old table claimed, past the end
     * of the file too, where the repair may now allocate. */
    qcow2_snapshots_protect(s);
    return 0;
}

bool coroutine_fn qcow2_snapshots_protect(Qcow2State *s)
{
    Qcow2Snapshot *sn;
    uint32_t n;
    uint64_t len = 0;
    QkError err = {0};
    if (qcow2_snapshots_read_lenient(s, &sn, &n, &len, &err) == 0) {
        qcow2_meta_set_snapshots(s, sn, n, s->h.snapshots_offset, len);
        qcow2_snapshots_free(sn, n);
        return false;
    }
    qcow2_meta_set_snapshots(s, NULL, 0, s->h.snapshots_offset, len);
    qk_error_clear(&err);
    int64_t flen = qk_block_length(s->bs->file);
    uint64_t end;
    if (flen < 0 || qk_add_overflow(s->h.snapshots_offset, len, &end) || end <= (uint64_t)flen) {
        return false;
    }
    /* Only what lies before the next cluster boundary: a growing file
     * fills that with zeros without writing it. Further on, a growing
     * file would place a cluster there, which the protection refuses. */
    return qk_align_up(end, s->cluster_size) <= qk_align_up((uint64_t)flen, s->cluster_size);
}

int qcow2_snapshot_find(const Qcow2Snapshot *sn, uint32_t n, const char *id, const char *name)
{
    if (!id && !name) {
        return -1; /* naming nothing never means "the first one" */
    }
    for (uint32_t i = 0; i < n; i++) {
        if ((!id || strcmp(sn[i].id, id) == 0) && (!name || strcmp(sn[i].name, name) == 0)) {
            return (int)i;
        }
    }
    return -1;
}

int qcow2_snapshot_find_id_or_name(const Qcow2Snapshot *sn, uint32_t n, const char *str)
{
    if (!str) {
        return -1;
    }
    int i = qcow2_snapshot_find(sn, n, str, NULL);
    return i >= 0 ? i : qcow2_snapshot_find(sn, n, NULL, str);
}

uint64_t qcow2_snapshot_next_id(const Qcow2Snapshot *sn, uint32_t n)
{
    uint64_t max = 0;
    for (uint32_t i = 0; i < n; i++) {
        char *end;
        unsigned long long v = strtoull(sn[i].id, &end, 10);
        if (sn[i].id[0] && !*end && v > max) {
            max = v;
        }
    }
    return max + 1;
}
