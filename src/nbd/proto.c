/*
 * NBD wire encoding and the parsing of client messages. Every length in a
 * client message is checked against the bytes actually received before it
 * is used.
 *
 * Owns: byte layouts. Must not know about sockets or block nodes.
 */
#include "nbd/proto.h"

#include <errno.h>

int qk_nbd_parse_request(const uint8_t *buf, QkNbdRequest *req)
{
    if (qk_be32_get(buf) != NBD_REQUEST_MAGIC) {
        return -EINVAL;
    }
    req->flags = qk_be16_get(buf + 4);
    req->type = qk_be16_get(buf + 6);
    req->cookie = qk_be64_get(buf + 8);
    req->offset = qk_be64_get(buf + 16);
    req->length = qk_be32_get(buf + 24);
    return 0;
}

uint32_t qk_nbd_errno_to_wire(int err)
{
    switch (err < 0 ? -err : err) {
    case 0:
        return 0;
    case EPERM:
    case EACCES:
    case EROFS:
        return NBD_EPERM;
    case ENOMEM:
        return NBD_ENOMEM;
    case EINVAL:
        return NBD_EINVAL;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return NBD_ENOSPC;
    case EOVERFLOW:
        return NBD_EOVERFLOW;
    case ENOTSUP:
        return NBD_ENOTSUP;
    case ESHUTDOWN:
        return NBD_ESHUTDOWN;
    default:
        return NBD_EIO;
    }
}

void qk_nbd_simple_reply(uint8_t *buf, uint32_t error, uint64_t cookie)
{
    qk_be32_put(buf, NBD_SIMPLE_REPLY_MAGIC);
    qk_be32_put(buf + 4, error);
    qk_be64_put(buf + 8, cookie);
}

void qk_nbd_chunk_header(uint8_t *buf, uint16_t flags, uint16_t type, uint64_t cookie,
                         uint32_t length)
{
    qk_be32_put(buf, NBD_STRUCTURED_REPLY_MAGIC);
    qk_be16_put(buf + 4, flags);
    qk_be16_put(buf + 6, type);
    qk_be64_put(buf + 8, cookie);
    qk_be32_put(buf + 16, length);
}

int qk_nbd_parse_info_request(const uint8_t *data, uint32_t len, QkNbdInfoRequest *out)
{
    if (len < 4) {
        return -EINVAL;
    }
    uint32_t nlen = qk_be32_get(data);
    /* name + the 16-bit count must fit; compare without adding to nlen. */
    if (nlen > len - 4 || len - 4 - nlen < 2) {
        return -EINVAL;
    }
    out->name = (const char *)data + 4;
    out->name_len = nlen;
    const uint8_t *p = data + 4 + nlen;
    out->ninfos = qk_be16_get(p);
    out->infos = p + 2;
    if ((uint64_t)out->ninfos * 2 != (uint64_t)(len - 4 - nlen - 2)) {
        return -EINVAL;
    }
    return 0;
}

int qk_nbd_parse_meta_request(const uint8_t *data, uint32_t len, QkNbdMetaRequest *out,
                              void (*query)(void *opaque, const char *q, uint32_t qlen),
                              void *opaque)
{
    if (len < 4) {
        return -EINVAL;
    }
    uint32_t nlen = qk_be32_get(data);
    if (nlen > len - 4 || len - 4 - nlen < 4) {
        return -EINVAL;
    }
    out->name = (const char *)data + 4;
    out->name_len = nlen;
    uint32_t pos = 4 + nlen;
    out->nqueries = qk_be32_get(data + pos);
    pos += 4;
    for (uint32_t i = 0; i < out->nqueries; i++) {
        if (len - pos < 4) {
            return -EINVAL;
        }
        uint32_t qlen = qk_be32_get(data + pos);
        pos += 4;
        if (qlen > len - pos) {
            return -EINVAL;
        }
        if (query) {
            query(opaque, (const char *)data + pos, qlen);
        }
        pos += qlen;
    }
    return pos == len ? 0 : -EINVAL;
}

int qk_nbd_query_matches_base_allocation(const char *q, uint32_t qlen, bool list)
{
    static const char full[] = QK_NBD_META_BASE_ALLOCATION;
    if (qlen == 5 && memcmp(q, "base:", 5) == 0) {
        return list;
    }
    return qlen == sizeof(full) - 1 && memcmp(q, full, qlen) == 0;
}
