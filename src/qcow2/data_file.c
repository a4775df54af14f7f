/*
 * External data files (incompatible feature bit 2): guest clusters live
 * in a separate file at their guest offsets, and the qcow2 file holds
 * only metadata. Owns finding, opening, flushing and closing that file;
 * the I/O paths reach it through s->data.
 *
 * With the raw bit (autoclear bit 1) the data file is also a complete raw
 * image of the disk: every cluster is mapped at creation, and zero writes
 * and discards zero the data file as well as the L2 entries (zero.c), so
 * it stays readable on its own.
 */
#include "qcow2/qcow2_int.h"
#include "block/block.h"
#include "block/file_lock.h"

#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Whether paths A and B name one file, existing or still to be made (the
 * same name in the same directory, however spelt). */
bool qcow2_same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    bool ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea || eb) {
        return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    }
    char *da = strdup(a), *db = strdup(b), *ba = strdup(a), *bb = strdup(b);
    bool same = false;
    if (da && db && ba && bb && strcmp(basename(ba), basename(bb)) == 0) {
        char *ra = realpath(dirname(da), NULL), *rb = realpath(dirname(db), NULL);
        same = ra && rb && strcmp(ra, rb) == 0;
        free(ra);
        free(rb);
    }
    free(da);
    free(db);
    free(ba);
    free(bb);
    return same;
}

int coroutine_fn qcow2_data_file_open(Qcow2State *s, const QkOpenOptions *opts, QkError *err)
{
    s->data = s->bs->file;
    if (!(s->h.incompatible_features & QCOW2_INCOMPAT_DATA_FILE)) {
        if ((s->h.autoclear_features & QCOW2_AUTOCLEAR_DATA_FILE_RAW) && !(opts->flags & QK_OPEN_METADATA_ONLY)) {
            /* The spec allows the bit only with a data file; QEMU refuses
             * to read or write such an image (info still shows it). */
            return qk_error_set(err, -EINVAL, "data-file-raw requires a data file");
        }
        s->data_raw = false;
        return 0;
    }
    const Qcow2Ext *name = NULL;
    for (const Qcow2Ext *e = s->exts; e; e = e->next) {
        if (e->type == QCOW2_EXT_DATA_FILE) {
            name = e;
        }
    }
    if (!name || name->len == 0) {
        return qk_error_set(err, -EINVAL, "'data-file' is required for this image");
    }
    if (name->len > 4095 || memchr(name->data, '\0', name->len)) {
        return qk_error_corrupt(err, "external data file name is malformed");
    }
    /* An image names only a plain local file: never a protocol or a json:
     * description, which would let a crafted image reach anything the
     * user can (QEMU's CVE-2024-4467). */
    if ((name->len >= 5 && memcmp(name->data, "json:", 5) == 0) || memmem(name->data, name->len, "://", 3) ||
        (name->len >= 4 && (memcmp(name->data, "nbd:", 4) == 0 || memcmp(name->data, "rbd:", 4) == 0))) {
        return qk_error_set(err, -EINVAL, "the external data file '%.*s' is not a plain local file name",
                            (int)name->len, (const char *)name->data);
    }
    s->data_file_name = strndup((const char *)name->data, name->len);
    if (!s->data_file_name) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    if (s->h.nb_snapshots) {
        /* The spec forbids them: a snapshot's clusters could not be kept apart. */
        return qk_error_corrupt(err, "an image with an external data file cannot have internal snapshots");
    }
    if (qcow2_same_file(s->bs->file->filename, s->data_file_name)) {
        /* Guest data would land on the tables; the overlap check does not
         * look at data-file writes, so refuse it here. */
        return qk_error_set(err, -EINVAL, "the external data file '%s' is the image file itself",
                            s->data_file_name);
    }
    s->data_raw = (s->h.autoclear_features & QCOW2_AUTOCLEAR_DATA_FILE_RAW) != 0;
    int flags = opts->flags & (QK_OPEN_RDWR | QK_OPEN_NOCACHE | QK_OPEN_WRITETHROUGH | QK_OPEN_NO_FLUSH |
                               QK_OPEN_FORCE_SHARE);
    if (s->bs->read_only) {
        flags &= ~QK_OPEN_RDWR;
    }
    /* The name is used as it is: a relative one is relative to the
     * current directory, as create made it and as qemu-img opens it (not
     * to the image's directory, as a backing file name is). */
    QkBlock *d = qk_co_file_open(s->data_file_name, flags, err);
    if (!d && (opts->flags & QK_OPEN_METADATA_ONLY) && s->bs->read_only) {
        /* info describes the image without its data, as qemu-img does
         * (a data file on a mount that is not there, or not yet made).
         * Every guest-data request stops in the block layer first. */
        qk_error_clear(err);
        s->bs->no_guest_data = true;
        s->data = NULL;
        return 0;
    }
    if (!d) {
        return err->code ? err->code : -EIO;
    }
    /* Locked as QEMU locks a data file: what it takes, nothing it refuses
     * to share (others may write guest data, as with a raw image), so a
     * holder that shares no writes (a copy's source) keeps it out. */
    unsigned perm = QK_PERM_CONSISTENT_READ | ((flags & QK_OPEN_RDWR) ? QK_PERM_WRITE | QK_PERM_RESIZE : 0);
    if (qk_file_node_lock(d, perm, QK_PERM_ALL, false, err) < 0) {
        qk_co_block_close(d);
        return err->code;
    }
    s->data = d;
    return 0;
}

int coroutine_fn qcow2_data_file_flush(Qcow2State *s)
{
    return qcow2_has_data_file(s) && s->data ? qk_co_flush(s->data) : 0;
}

int coroutine_fn qcow2_data_file_close(Qcow2State *s)
{
    int r = 0;
    if (s->data && qcow2_has_data_file(s)) {
        r = qk_co_block_close(s->data);
    }
    s->data = NULL;
    free(s->data_file_name);
    s->data_file_name = NULL;
    return r;
}

int coroutine_fn qcow2_data_file_amend(QkBlock *bs, const char *name, bool clear_raw, QkError *err)
{
    Qcow2State *s = qcow2_state(bs);
    if (name && strlen(name) > 4095) {
        return qk_error_set(err, -EINVAL, "data file name too long");
    }
    char *copy = name && *name ? strdup(name) : NULL;
    if (name && *name && !copy) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    if (name) {
        /* The extension list is what the header rewrite lays out. */
        for (Qcow2Ext **p = &s->exts; *p; p = &(*p)->next) {
            Qcow2Ext *e = *p;
            if (e->type != QCOW2_EXT_DATA_FILE) {
                continue;
            }
            if (copy) {
                free(e->data);
                e->data = (uint8_t *)strdup(copy);
                e->len = (uint32_t)strlen(copy);
                if (!e->data) {
                    free(copy);
                    return qk_error_set(err, -ENOMEM, "out of memory");
                }
            } else {
                *p = e->next;
                free(e->data);
                free(e);
            }
            break;
        }
    }
    Qcow2Header h = s->h;
    if (clear_raw) {
        h.autoclear_features &= ~QCOW2_AUTOCLEAR_DATA_FILE_RAW;
    }
    int r = qcow2_co_rewrite_header(bs, &h, err);
    if (r == 0) {
        s->data_raw = (s->h.autoclear_features & QCOW2_AUTOCLEAR_DATA_FILE_RAW) != 0;
        if (name) {
            /* This open keeps using the file it has; the next finds the new one. */
            free(s->data_file_name);
            s->data_file_name = copy;
            copy = NULL;
        }
    }
    free(copy);
    return r;
}
