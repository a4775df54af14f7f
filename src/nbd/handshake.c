/*
 * Fixed newstyle option haggling: greeting, then options until the client
 * picks an export (NBD_OPT_GO / NBD_OPT_EXPORT_NAME) or leaves. A client
 * that breaks the protocol loses its own connection and nothing else.
 *
 * Owns: option parsing and replies. Must not know about request handling.
 */
#include "nbd/proto.h"
#include "nbd/server_int.h"
#include "aio/loop.h"
#include "block/dirty_bitmap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Larger options than this are not read at all: a hostile length must
 * not make us buffer gigabytes before we can say no. */
#define MAX_OPTION_SKIP (16u << 20)
#define PREFERRED_BLOCK 4096u

static int coroutine_fn opt_reply(QkNbdClient *c, uint32_t opt, uint32_t type,
                                  const void *data, uint32_t len)
{
    uint8_t h[20];
    qk_be64_put(h, NBD_REP_MAGIC);
    qk_be32_put(h + 8, opt);
    qk_be32_put(h + 12, type);
    qk_be32_put(h + 16, len);
    struct iovec iov[2] = {{h, sizeof(h)}, {(void *)data, len}};
    return qk_co_sock_writev_until(c->fd, iov, len ? 2 : 1, c->rd->deadline_ns);
}

static int coroutine_fn opt_error(QkNbdClient *c, uint32_t opt, uint32_t type, const char *msg)
{
    return opt_reply(c, opt, type, msg, (uint32_t)strlen(msg));
}

static int coroutine_fn send_info(QkNbdClient *c, uint32_t opt, uint16_t type,
                                  const void *data, uint32_t len)
{
    uint8_t buf[2 + 4096];
    if (len > sizeof(buf) - 2) {
        len = sizeof(buf) - 2;
    }
    qk_be16_put(buf, type);
    memcpy(buf + 2, data, len);
    return opt_reply(c, opt, NBD_REP_INFO, buf, 2 + len);
}

static void attach(QkNbdClient *c, QkNbdExport *exp)
{
    c->exp = exp;
    exp->clients++;
}

/* NBD_OPT_INFO and NBD_OPT_GO. Returns 1 when GO succeeded. */
static void free_names(char **names, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
}

static void drop_contexts(QkNbdClient *c)
{
    c->base_alloc = c->alloc_depth = false;
    free_names(c->bitmaps, c->nbitmaps);
    c->bitmaps = NULL;
    c->nbitmaps = 0;
    free(c->meta_export);
    c->meta_export = NULL;
}

/* proto.md: contexts set for another export than the one the client
 * settles on are dropped (GO and EXPORT_NAME alike). */
static void keep_contexts_of(QkNbdClient *c, const char *name, uint32_t len)
{
    if (c->meta_export && strlen(c->meta_export) == len && memcmp(c->meta_export, name, len) == 0) {
        return;
    }
    drop_contexts(c);
}

static int coroutine_fn opt_info(QkNbdClient *c, uint32_t opt, const uint8_t *data, uint32_t len)
{
    QkNbdInfoRequest rq;
    if (qk_nbd_parse_info_request(data, len, &rq) < 0) {
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed info request");
    }
    QkNbdExport *exp = qk_nbd_lookup(c->srv, rq.name, rq.name_len);
    if (!exp) {
        return opt_error(c, opt, NBD_REP_ERR_UNKNOWN, "no such export");
    }
    /* Copy what we send: the export may go away while we are yielding. */
    uint64_t size = (uint64_t)qk_block_length(exp->bs);
    uint16_t flags = qk_nbd_export_flags(exp, c->structured);
    char *desc = exp->description ? strdup(exp->description) : NULL;
    /* The export's own name, as qemu-nbd answers: "" asks for the default. */
    char *canon = strdup(exp->name);
    if (!canon) {
        free(desc);
        return -ENOMEM;
    }
    if (opt == NBD_OPT_GO) {
        attach(c, exp);
        keep_contexts_of(c, rq.name, rq.name_len);
    }
    bool want_name = false, want_desc = false;
    for (uint16_t i = 0; i < rq.ninfos; i++) {
        uint16_t t = qk_be16_get(rq.infos + 2 * i);
        want_name |= t == NBD_INFO_NAME;
        want_desc |= t == NBD_INFO_DESCRIPTION;
    }
    uint8_t ex[10];
    qk_be64_put(ex, size);
    qk_be16_put(ex + 8, flags);
    int r = send_info(c, opt, NBD_INFO_EXPORT, ex, sizeof(ex));
    if (r == 0 && want_name) {
        r = send_info(c, opt, NBD_INFO_NAME, canon, (uint32_t)strlen(canon));
    }
    free(canon);
    if (r == 0 && want_desc && desc) {
        r = send_info(c, opt, NBD_INFO_DESCRIPTION, desc, (uint32_t)strlen(desc));
    }
    free(desc);
    if (r == 0) {
        /* Any alignment works (the block layer does read-modify-write),
         * 4 KiB avoids it, and payloads stop at 32 MiB. */
        uint8_t bsz[12];
        qk_be32_put(bsz, 1);
        qk_be32_put(bsz + 4, PREFERRED_BLOCK);
        qk_be32_put(bsz + 8, QK_NBD_MAX_PAYLOAD);
        r = send_info(c, opt, NBD_INFO_BLOCK_SIZE, bsz, sizeof(bsz));
    }
    if (r == 0) {
        r = opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
    }
    if (r < 0) {
        return r;
    }
    return opt == NBD_OPT_GO ? 1 : 0;
}

/* NBD_OPT_EXPORT_NAME: no way to say no but hanging up. */
static int coroutine_fn opt_export_name(QkNbdClient *c, const uint8_t *data, uint32_t len)
{
    QkNbdExport *exp = qk_nbd_lookup(c->srv, (const char *)data, len);
    if (!exp) {
        return -ENOENT;
    }
    uint8_t buf[8 + 2 + 124] = {0};
    qk_be64_put(buf, (uint64_t)qk_block_length(exp->bs));
    qk_be16_put(buf + 8, qk_nbd_export_flags(exp, c->structured));
    attach(c, exp);
    keep_contexts_of(c, (const char *)data, len);
    int r = qk_co_sock_write_until(c->fd, buf, c->no_zeroes ? 10 : sizeof(buf), c->rd->deadline_ns);
    return r < 0 ? r : 1;
}

static int coroutine_fn opt_list(QkNbdClient *c, uint32_t len)
{
    if (len != 0) {
        return opt_error(c, NBD_OPT_LIST, NBD_REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
    }
    /* Snapshot the names first: the list may change while we send. */
    size_t n = 0;
    for (QkNbdExport *e = c->srv->exports; e; e = e->next) {
        n++;
    }
    char **names = calloc(n ? n : 1, sizeof(*names));
    if (!names) {
        return -ENOMEM;
    }
    size_t i = 0;
    for (QkNbdExport *e = c->srv->exports; e && i < n; e = e->next) {
        names[i++] = strdup(e->name);
    }
    int r = 0;
    for (i = 0; i < n && r == 0; i++) {
        if (!names[i]) {
            continue;
        }
        uint32_t nl = (uint32_t)strlen(names[i]);
        uint8_t *buf = malloc(4 + nl);
        if (!buf) {
            r = -ENOMEM;
            break;
        }
        qk_be32_put(buf, nl);
        memcpy(buf + 4, names[i], nl);
        r = opt_reply(c, NBD_OPT_LIST, NBD_REP_SERVER, buf, 4 + nl);
        free(buf);
    }
    for (i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
    return r < 0 ? r : opt_reply(c, NBD_OPT_LIST, NBD_REP_ACK, NULL, 0);
}

/* The bitmaps an export offers as qemu:dirty-bitmap:NAME: its node's
 * named bitmaps that can be used (not left in use by a crash): the
 * image's persistent ones, those added over the control socket, and on a
 * backup's point-in-time export the bitmap as of the backup's start. */
static bool offered(const QkDirtyBitmap *bm)
{
    return !bm->inconsistent && bm->name;
}

typedef struct MetaMatch {
    bool list;
    QkBlock *bs;
    bool base_alloc;
    bool alloc_depth;
    bool all_bitmaps;
    char **bitmaps;             /* named ones, in query order */
    unsigned nbitmaps;
    bool oom;
} MetaMatch;

static void add_bitmap(MetaMatch *m, const char *name, uint32_t len)
{
    for (unsigned i = 0; i < m->nbitmaps; i++) {
        if (strlen(m->bitmaps[i]) == len && memcmp(m->bitmaps[i], name, len) == 0) {
            return;
        }
    }
    char **nb = realloc(m->bitmaps, (m->nbitmaps + 1) * sizeof(*nb));
    char *copy = nb ? strndup(name, len) : NULL;
    if (!copy) {
        m->bitmaps = nb ? nb : m->bitmaps;
        m->oom = true;
        return;
    }
    m->bitmaps = nb;
    m->bitmaps[m->nbitmaps++] = copy;
}

static void meta_query(void *opaque, const char *q, uint32_t qlen)
{
    MetaMatch *m = opaque;
    static const char qemu[] = "qemu:", dirty[] = QK_NBD_META_DIRTY_BITMAP;
    if (qk_nbd_query_matches_base_allocation(q, qlen, m->list)) {
        m->base_alloc = true;
    } else if (qlen == sizeof(qemu) - 1 && memcmp(q, qemu, qlen) == 0) {
        m->all_bitmaps |= m->list; /* a bare namespace lists, never selects */
        m->alloc_depth |= m->list;
    } else if (qlen == sizeof(QK_NBD_META_ALLOCATION_DEPTH) - 1 && memcmp(q, QK_NBD_META_ALLOCATION_DEPTH, qlen) == 0) {
        m->alloc_depth = true;
    } else if (qlen >= sizeof(dirty) - 1 && memcmp(q, dirty, sizeof(dirty) - 1) == 0) {
        const char *name = q + sizeof(dirty) - 1;
        uint32_t nlen = qlen - (uint32_t)(sizeof(dirty) - 1);
        if (nlen == 0) {
            m->all_bitmaps |= m->list;
            return;
        }
        for (QkDirtyBitmap *bm = m->bs->dirty_bitmaps; bm; bm = bm->next) {
            if (offered(bm) && strlen(bm->name) == nlen && memcmp(bm->name, name, nlen) == 0) {
                add_bitmap(m, name, nlen);
            }
        }
    }
}

static int coroutine_fn reply_context(QkNbdClient *c, uint32_t opt, uint32_t id, const char *prefix, const char *name)
{
    size_t pl = strlen(prefix), nl = name ? strlen(name) : 0;
    uint8_t *buf = malloc(4 + pl + nl);
    if (!buf) {
        return -ENOMEM;
    }
    qk_be32_put(buf, opt == NBD_OPT_SET_META_CONTEXT ? id : 0);
    memcpy(buf + 4, prefix, pl);
    if (nl) {
        memcpy(buf + 4 + pl, name, nl);
    }
    int r = opt_reply(c, opt, NBD_REP_META_CONTEXT, buf, (uint32_t)(4 + pl + nl));
    free(buf);
    return r;
}

static int coroutine_fn opt_meta(QkNbdClient *c, uint32_t opt, const uint8_t *data, uint32_t len)
{
    /* proto.md: a SET replaces the contexts set before, also when it fails. */
    if (opt == NBD_OPT_SET_META_CONTEXT) {
        drop_contexts(c);
    }
    if (opt == NBD_OPT_SET_META_CONTEXT && !c->structured) {
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "structured replies not negotiated");
    }
    QkNbdMetaRequest rq;
    /* The export is named before the queries: find it first. */
    if (qk_nbd_parse_meta_request(data, len, &rq, NULL, NULL) < 0) {
        return opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed meta context request");
    }
    QkNbdExport *exp = qk_nbd_lookup(c->srv, rq.name, rq.name_len);
    if (!exp) {
        return opt_error(c, opt, NBD_REP_ERR_UNKNOWN, "no such export");
    }
    MetaMatch m = {.list = opt == NBD_OPT_LIST_META_CONTEXT, .bs = exp->bs};
    qk_nbd_parse_meta_request(data, len, &rq, meta_query, &m);
    if (m.list && rq.nqueries == 0) {
        m.base_alloc = true;
        m.alloc_depth = true;
        m.all_bitmaps = true;
    }
    if (m.all_bitmaps) {
        /* Oldest first: the node keeps the newest at the head. */
        unsigned total = 0;
        for (QkDirtyBitmap *bm = exp->bs->dirty_bitmaps; bm; bm = bm->next) {
            total += offered(bm);
        }
        for (unsigned k = total; k > 0; k--) {
            unsigned i = 0;
            for (QkDirtyBitmap *bm = exp->bs->dirty_bitmaps; bm; bm = bm->next) {
                if (offered(bm) && ++i == k) {
                    add_bitmap(&m, bm->name, (uint32_t)strlen(bm->name));
                }
            }
        }
    }
    if (m.oom) {
        free_names(m.bitmaps, m.nbitmaps);
        return -ENOMEM;
    }
    int r = 0;
    /* The ids only mean something after SET; LIST answers 0. */
    if (m.base_alloc) {
        r = reply_context(c, opt, QK_NBD_CTX_BASE, QK_NBD_META_BASE_ALLOCATION, NULL);
    }
    if (r == 0 && m.alloc_depth) {
        r = reply_context(c, opt, QK_NBD_CTX_DEPTH, QK_NBD_META_ALLOCATION_DEPTH, NULL);
    }
    for (unsigned i = 0; r == 0 && i < m.nbitmaps; i++) {
        r = reply_context(c, opt, QK_NBD_CTX_BITMAP0 + i, QK_NBD_META_DIRTY_BITMAP, m.bitmaps[i]);
    }
    if (opt == NBD_OPT_SET_META_CONTEXT) {
        c->base_alloc = m.base_alloc;
        c->alloc_depth = m.alloc_depth;
        free_names(c->bitmaps, c->nbitmaps);
        c->bitmaps = m.bitmaps;
        c->nbitmaps = m.nbitmaps;
        free(c->meta_export);
        c->meta_export = strndup(rq.name, rq.name_len);
    } else {
        free_names(m.bitmaps, m.nbitmaps);
    }
    return r < 0 ? r : opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
}

static int coroutine_fn haggle(QkNbdClient *c)
{
    uint8_t greet[18];
    qk_be64_put(greet, NBD_MAGIC);
    qk_be64_put(greet + 8, NBD_OPTS_MAGIC);
    qk_be16_put(greet + 16, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
    int r = qk_co_sock_write_until(c->fd, greet, sizeof(greet), c->rd->deadline_ns);
    if (r < 0) {
        return r;
    }
    uint8_t cf[4];
    r = qk_co_sock_read(c->rd, cf, sizeof(cf));
    if (r < 0) {
        return r;
    }
    uint32_t cflags = qk_be32_get(cf);
    if (cflags & ~(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)) {
        return -EINVAL; /* the protocol says: close on unknown client flags */
    }
    c->no_zeroes = (cflags & NBD_FLAG_C_NO_ZEROES) != 0;

    for (;;) {
        uint8_t h[16];
        /* Also for a client whose options never make us wait. */
        if (c->rd->deadline_ns && qk_clock_ns() >= c->rd->deadline_ns) {
            return -ETIMEDOUT;
        }
        r = qk_co_sock_read(c->rd, h, sizeof(h));
        if (r < 0) {
            return r;
        }
        if (qk_be64_get(h) != NBD_OPTS_MAGIC) {
            return -EINVAL;
        }
        uint32_t opt = qk_be32_get(h + 8);
        uint32_t len = qk_be32_get(h + 12);
        if (c->srv->shutting_down && opt != NBD_OPT_ABORT) {
            r = qk_co_sock_skip(c->rd, len);
            if (r == 0) {
                r = opt_error(c, opt, NBD_REP_ERR_SHUTDOWN, "server is shutting down");
            }
            if (r < 0) {
                return r;
            }
            continue;
        }
        if (len > QK_NBD_MAX_OPTION) {
            if (opt == NBD_OPT_EXPORT_NAME || len > MAX_OPTION_SKIP) {
                return -EINVAL;
            }
            r = qk_co_sock_skip(c->rd, len);
            if (r == 0) {
                r = opt_error(c, opt, NBD_REP_ERR_TOO_BIG, "option too large");
            }
            if (r < 0) {
                return r;
            }
            continue;
        }
        uint8_t *data = malloc((size_t)len + 1);
        if (!data) {
            return -ENOMEM;
        }
        r = qk_co_sock_read(c->rd, data, len);
        if (r < 0) {
            free(data);
            return r;
        }
        data[len] = 0;
        switch (opt) {
        case NBD_OPT_EXPORT_NAME:
            r = opt_export_name(c, data, len);
            break;
        case NBD_OPT_ABORT:
            opt_reply(c, opt, NBD_REP_ACK, NULL, 0); /* best effort: the client may be gone */
            free(data);
            return 0;
        case NBD_OPT_LIST:
            r = opt_list(c, len);
            break;
        case NBD_OPT_INFO:
        case NBD_OPT_GO:
            r = opt_info(c, opt, data, len);
            break;
        case NBD_OPT_STRUCTURED_REPLY:
            if (len != 0) {
                r = opt_error(c, opt, NBD_REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data");
            } else if (c->structured) {
                r = opt_error(c, opt, NBD_REP_ERR_INVALID, "structured replies already negotiated");
            } else {
                c->structured = true;
                r = opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
            }
            break;
        case NBD_OPT_LIST_META_CONTEXT:
        case NBD_OPT_SET_META_CONTEXT:
            r = opt_meta(c, opt, data, len);
            break;
        default:
            r = opt_error(c, opt, NBD_REP_ERR_UNSUP, "option not supported");
            break;
        }
        free(data);
        if (r != 0) {
            return r;
        }
    }
}

int coroutine_fn qk_nbd_handshake(QkNbdClient *c)
{
    /* A client that connects and then stalls (or never reads our
     * replies) would hold its socket and coroutine forever: the whole
     * haggling has a time limit, as qemu-nbd's --handshake-limit. */
    int64_t limit = c->srv->handshake_limit_ns;
    c->rd->deadline_ns = limit ? qk_clock_ns() + limit : 0;
    int r = haggle(c);
    c->rd->deadline_ns = 0;
    return r;
}
