/*
 * The persistent dirty bitmaps' directory (the bitmaps header extension):
 * reading it (bounded as QEMU bounds it), laying it out again, and the
 * name/granularity/flags list `info` shows. What the bitmaps hold, and
 * keeping them up to date, is bitmaps.c's.
 */
#include "qcow2/qcow2_int.h"

#include <stdlib.h>
#include <string.h>

#define BME_FIXED 24u
/* Bounds QEMU sets on a directory it loads. */
#define MAX_DIR_BYTES (64u << 20)
#define MAX_BITMAPS 65535u
#define MAX_NAME 1023u

void qcow2_bitmap_dir_free(Qcow2BmDir *d)
{
    for (uint32_t i = 0; i < d->n; i++) {
        free(d->e[i].name);
        free(d->e[i].extra);
    }
    free(d->e);
    memset(d, 0, sizeof(*d));
}

uint64_t qcow2_bitmap_entry_len(const Qcow2BmEntry *e)
{
    return qk_align_up((uint64_t)BME_FIXED + e->extra_len + strlen(e->name), 8);
}

void qcow2_bitmap_dir_layout(const Qcow2BmEntry *e, uint32_t n, uint8_t *buf)
{
    uint64_t p = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t len = qcow2_bitmap_entry_len(&e[i]);
        size_t nl = strlen(e[i].name);
        memset(buf + p, 0, len);
        qk_be64_put(buf + p, e[i].table_off);
        qk_be32_put(buf + p + 8, e[i].table_size);
        qk_be32_put(buf + p + 12, e[i].flags);
        buf[p + 16] = e[i].type;
        buf[p + 17] = e[i].gbits;
        qk_be16_put(buf + p + 18, (uint16_t)nl);
        qk_be32_put(buf + p + 20, e[i].extra_len);
        if (e[i].extra_len) {
            memcpy(buf + p + BME_FIXED, e[i].extra, e[i].extra_len);
        }
        memcpy(buf + p + BME_FIXED + e[i].extra_len, e[i].name, nl);
        p += len;
    }
}

/* Parses dir (len bytes, n entries); -QK_ECORRUPT when an entry does not
 * fit or breaks the format's rules for the layout. */
static int parse(Qcow2BmDir *d, const uint8_t *dir, uint64_t len, uint32_t n, const char **why)
{
    d->e = calloc(n ? n : 1, sizeof(*d->e));
    if (!d->e) {
        return -ENOMEM;
    }
    uint64_t p = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (p + BME_FIXED > len) {
            return -QK_ECORRUPT;
        }
        Qcow2BmEntry *e = &d->e[d->n];
        uint16_t name_len = qk_be16_get(dir + p + 18);
        uint32_t extra = qk_be32_get(dir + p + 20);
        uint64_t name_at = p + BME_FIXED + extra;
        if (name_len == 0 || name_len > MAX_NAME || extra > len || name_at + name_len > len) {
            return -QK_ECORRUPT;
        }
        /* Names are C strings everywhere else: one cut short at a NUL
         * would be stored back shorter, even empty. */
        if (memchr(dir + name_at, 0, name_len)) {
            *why = "a bitmap name contains a NUL byte";
            return -QK_ECORRUPT;
        }
        e->table_off = qk_be64_get(dir + p);
        e->table_size = qk_be32_get(dir + p + 8);
        e->flags = qk_be32_get(dir + p + 12);
        e->type = dir[p + 16];
        e->gbits = dir[p + 17];
        e->extra_len = extra;
        e->name = strndup((const char *)dir + name_at, name_len);
        e->extra = extra ? malloc(extra) : NULL;
        d->n++;
        if (!e->name || (extra && !e->extra)) {
            return -ENOMEM;
        }
        if (extra) {
            memcpy(e->extra, dir + p + BME_FIXED, extra);
        }
        p = qk_align_up(name_at + name_len, 8);
    }
    return 0;
}

int coroutine_fn qcow2_bitmap_dir_read(Qcow2State *s, Qcow2BmDir *d, const char **why)
{
    memset(d, 0, sizeof(*d));
    *why = NULL;
    for (Qcow2Ext *x = s->exts; x; x = x->next) {
        if (x->type != QCOW2_EXT_BITMAPS) {
            continue;
        }
        /* QEMU's words: it refuses both at open. */
        if (x->len != 24) {
            *why = "bitmaps_ext: Invalid extension length";
            return -QK_ECORRUPT;
        }
        if (qk_be32_get(x->data + 4) != 0) {
            *why = "bitmaps_ext: Reserved field is not zero";
            return -QK_ECORRUPT;
        }
        uint32_t n = qk_be32_get(x->data);
        uint64_t len = qk_be64_get(x->data + 8), off = qk_be64_get(x->data + 16);
        if (n == 0) {
            *why = "bitmaps_ext: found bitmaps extension with zero bitmaps";
        } else if (n > MAX_BITMAPS) {
            *why = "bitmaps_ext: Image has more bitmaps than the supported maximum of 65535";
        } else if (len > MAX_DIR_BYTES) {
            *why = "bitmaps_ext: Bitmap directory is too large";
        } else if (len < (uint64_t)n * BME_FIXED) {
            *why = "bitmaps_ext: Bitmap directory is too small for its bitmaps";
        } else if (!qk_is_aligned(off, s->cluster_size)) {
            *why = "bitmaps_ext: Invalid bitmap directory offset";
        } else if (!qk_range_within(off, len, s->file_size)) {
            *why = "bitmaps_ext: the bitmap directory lies past the end of the file";
        }
        if (*why) {
            return -QK_ECORRUPT;
        }
        uint8_t *dir = malloc(len);
        if (!dir) {
            return -ENOMEM;
        }
        int r = qk_co_pread(s->bs->file, off, len, dir, 0);
        if (r == 0) {
            r = parse(d, dir, len, n, why);
        }
        free(dir);
        if (r < 0) {
            qcow2_bitmap_dir_free(d);
            return r;
        }
        d->off = off;
        d->size = len;
        return 0;
    }
    return 0;
}

void qcow2_bitmaps_free_list(Qcow2State *s)
{
    for (int i = 0; i < s->nb_bitmaps; i++) {
        free(s->bitmaps[i].name);
    }
    free(s->bitmaps);
    s->bitmaps = NULL;
    s->nb_bitmaps = 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorted, not compared pairwise: a directory may hold 65535 names. */
int qcow2_bitmap_dir_dup_name(const Qcow2BmDir *d, const char **dup)
{
    if (d->n < 2) {
        return 0;
    }
    const char **names = malloc(d->n * sizeof(*names));
    if (!names) {
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < d->n; i++) {
        names[i] = d->e[i].name;
    }
    qsort(names, d->n, sizeof(*names), cmp_names);
    int found = 0;
    for (uint32_t i = 1; i < d->n && !found; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            *dup = names[i];
            found = 1;
        }
    }
    free(names);
    return found;
}

int coroutine_fn qcow2_bitmaps_load_list(Qcow2State *s)
{
    if (!(s->h.autoclear_features & QCOW2_AUTOCLEAR_BITMAPS)) {
        for (Qcow2Ext *e = s->exts; e; e = e->next) {
            s->bitmaps_stale |= e->type == QCOW2_EXT_BITMAPS;
        }
        return 0;
    }
    Qcow2BmDir d;
    const char *why;
    int r = qcow2_bitmap_dir_read(s, &d, &why);
    if (r == -QK_ECORRUPT) {
        /* Read-only users go on without the bitmaps; info says why. */
        s->bitmaps_problem = strdup(why ? why : "the bitmap directory is invalid");
    }
    if (r < 0 || d.n == 0) {
        return r;
    }
    for (uint32_t i = 0; i < d.n && !s->bitmaps_problem; i++) {
        QkError e = {0};
        if (qcow2_bitmap_check_entry(s, &d.e[i], false, &e) < 0) {
            s->bitmaps_problem = strdup(e.msg);
        }
    }
    const char *dup = NULL;
    if (!s->bitmaps_problem && qcow2_bitmap_dir_dup_name(&d, &dup) > 0) {
        QkError e = {0};
        qk_error_set(&e, -QK_ECORRUPT, "bitmap name '%s' appears more than once", dup);
        s->bitmaps_problem = strdup(e.msg);
    }
    s->bitmaps = calloc(d.n, sizeof(*s->bitmaps));
    if (!s->bitmaps) {
        qcow2_bitmap_dir_free(&d);
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < d.n; i++) {
        if (d.e[i].gbits > 63) {
            r = -QK_ECORRUPT;
            break;
        }
        QkBitmapInfo *b = &s->bitmaps[s->nb_bitmaps++];
        b->name = d.e[i].name;
        d.e[i].name = NULL;
        b->granularity = 1ULL << d.e[i].gbits;
        b->in_use = d.e[i].flags & QCOW2_BME_IN_USE;
        b->auto_enabled = d.e[i].flags & QCOW2_BME_AUTO;
    }
    qcow2_bitmap_dir_free(&d);
    if (r < 0) {
        qcow2_bitmaps_free_list(s);
    }
    return r;
}
