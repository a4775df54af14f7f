/*
 * NBD wire constants (the NBD project's doc/proto.md) and big-endian
 * field helpers. Shared by the server; the client driver uses libnbd and
 * needs none of this.
 *
 * Owns: numbers on the wire. Must not know about sockets or block nodes.
 */
#ifndef QK_NBD_PROTO_H
#define QK_NBD_PROTO_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/byteorder.h"

#define NBD_MAGIC              0x4e42444d41474943ULL /* "NBDMAGIC" */
#define NBD_OPTS_MAGIC         0x49484156454F5054ULL /* "IHAVEOPT" */
#define NBD_REP_MAGIC          0x0003e889045565a9ULL
#define NBD_REQUEST_MAGIC      0x25609513u
#define NBD_SIMPLE_REPLY_MAGIC 0x67446698u
#define NBD_STRUCTURED_REPLY_MAGIC 0x668e33efu

/* Handshake flags (server) and client flags. */
#define NBD_FLAG_FIXED_NEWSTYLE   (1u << 0)
#define NBD_FLAG_NO_ZEROES        (1u << 1)
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_C_NO_ZEROES      (1u << 1)

/* Transmission flags. */
#define NBD_FLAG_HAS_FLAGS         (1u << 0)
#define NBD_FLAG_READ_ONLY         (1u << 1)
#define NBD_FLAG_SEND_FLUSH        (1u << 2)
#define NBD_FLAG_SEND_FUA          (1u << 3)
#define NBD_FLAG_ROTATIONAL        (1u << 4)
#define NBD_FLAG_SEND_TRIM         (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF           (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN    (1u << 8)
#define NBD_FLAG_SEND_CACHE        (1u << 10)
#define NBD_FLAG_SEND_FAST_ZERO    (1u << 11)

/* Options. */
#define NBD_OPT_EXPORT_NAME       1
#define NBD_OPT_ABORT             2
#define NBD_OPT_LIST              3
#define NBD_OPT_STARTTLS          5
#define NBD_OPT_INFO              6
#define NBD_OPT_GO                7
#define NBD_OPT_STRUCTURED_REPLY  8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT  10

/* Option replies. */
#define NBD_REP_ACK          1u
#define NBD_REP_SERVER       2u
#define NBD_REP_INFO         3u
#define NBD_REP_META_CONTEXT 4u
#define NBD_REP_ERR(n)       ((1u << 31) | (n))
#define NBD_REP_ERR_UNSUP    NBD_REP_ERR(1)
#define NBD_REP_ERR_POLICY   NBD_REP_ERR(2)
#define NBD_REP_ERR_INVALID  NBD_REP_ERR(3)
#define NBD_REP_ERR_PLATFORM NBD_REP_ERR(4)
#define NBD_REP_ERR_TLS_REQD NBD_REP_ERR(5)
#define NBD_REP_ERR_UNKNOWN  NBD_REP_ERR(6)
#define NBD_REP_ERR_SHUTDOWN NBD_REP_ERR(7)
#define NBD_REP_ERR_TOO_BIG  NBD_REP_ERR(9)

/* NBD_REP_INFO types. */
#define NBD_INFO_EXPORT      0
#define NBD_INFO_NAME        1
#define NBD_INFO_DESCRIPTION 2
#define NBD_INFO_BLOCK_SIZE  3

/* Commands and their flags. */
#define NBD_CMD_READ         0
#define NBD_CMD_WRITE        1
#define NBD_CMD_DISC         2
#define NBD_CMD_FLUSH        3
#define NBD_CMD_TRIM         4
#define NBD_CMD_CACHE        5
#define NBD_CMD_WRITE_ZEROES 6
#define NBD_CMD_BLOCK_STATUS 7

#define NBD_CMD_FLAG_FUA       (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE   (1u << 1)
#define NBD_CMD_FLAG_DF        (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE   (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO (1u << 4)

/* Structured reply chunks. */
#define NBD_REPLY_FLAG_DONE          (1u << 0)
#define NBD_REPLY_TYPE_NONE          0
#define NBD_REPLY_TYPE_OFFSET_DATA   1
#define NBD_REPLY_TYPE_OFFSET_HOLE   2
#define NBD_REPLY_TYPE_BLOCK_STATUS  5
#define NBD_REPLY_TYPE_ERROR         ((1u << 15) + 1)

/* base:allocation status bits. */
#define NBD_STATE_HOLE (1u << 0)
#define NBD_STATE_ZERO (1u << 1)

/* Error values on the wire (not the host's errno numbering). */
#define NBD_EPERM     1
#define NBD_EIO       5
#define NBD_ENOMEM    12
#define NBD_EINVAL    22
#define NBD_ENOSPC    28
#define NBD_EOVERFLOW 75
#define NBD_ENOTSUP   95
#define NBD_ESHUTDOWN 108

#define NBD_REQUEST_SIZE 28
#define NBD_SIMPLE_REPLY_SIZE 16
#define NBD_CHUNK_HEADER_SIZE 20

/* The largest payload we accept or send in one request. */
#define QK_NBD_MAX_PAYLOAD (32u << 20)
/* Option payloads beyond this are hostile: strings are at most 4 KiB. */
#define QK_NBD_MAX_OPTION  (64u << 10)
#define QK_NBD_META_BASE_ALLOCATION "base:allocation"
#define QK_NBD_META_DIRTY_BITMAP "qemu:dirty-bitmap:"
#define QK_NBD_META_ALLOCATION_DEPTH "qemu:allocation-depth"
/* Context ids the server hands out: base:allocation, the allocation
 * depth, then one per dirty bitmap from QK_NBD_CTX_BITMAP0 on. */
#define QK_NBD_CTX_BASE 1u
#define QK_NBD_CTX_DEPTH 2u
#define QK_NBD_CTX_BITMAP0 3u
#define NBD_STATE_DIRTY (1u << 0)   /* qemu:dirty-bitmap contexts */

/* A parsed transmission request. */
typedef struct QkNbdRequest {
    uint16_t flags;
    uint16_t type;
    uint64_t cookie;
    uint64_t offset;
    uint32_t length;
} QkNbdRequest;

/* Parses a 28-byte request header; returns 0 or -EINVAL on a bad magic. */
int qk_nbd_parse_request(const uint8_t *buf, QkNbdRequest *req);
/* Maps a host errno (positive or negative) to the NBD error on the wire. */
uint32_t qk_nbd_errno_to_wire(int err);
/* Fills a simple reply (16 bytes) / a chunk header (20 bytes). */
void qk_nbd_simple_reply(uint8_t *buf, uint32_t error, uint64_t cookie);
void qk_nbd_chunk_header(uint8_t *buf, uint16_t flags, uint16_t type, uint64_t cookie,
                         uint32_t length);

/* The payload of NBD_OPT_INFO / NBD_OPT_GO: an export name and the
 * NBD_INFO_* items the client asked for. name points into the payload
 * (not NUL-terminated: name_len). Returns 0 or -EINVAL when malformed. */
typedef struct QkNbdInfoRequest {
    const char *name;
    uint32_t name_len;
    uint16_t ninfos;
    const uint8_t *infos;   /* ninfos big-endian uint16 */
} QkNbdInfoRequest;
int qk_nbd_parse_info_request(const uint8_t *data, uint32_t len, QkNbdInfoRequest *out);

/* The payload of NBD_OPT_LIST/SET_META_CONTEXT: an export name and
 * queries. The callback sees each query (not NUL-terminated); parsing
 * stops at the first malformed length. Returns 0 or -EINVAL. */
typedef struct QkNbdMetaRequest {
    const char *name;
    uint32_t name_len;
    uint32_t nqueries;
} QkNbdMetaRequest;
int qk_nbd_parse_meta_request(const uint8_t *data, uint32_t len, QkNbdMetaRequest *out,
                              void (*query)(void *opaque, const char *q, uint32_t qlen),
                              void *opaque);
/* True when a meta context query names base:allocation: "base:allocation",
 * or, for LIST only (list true), the bare namespace "base:", which SET must
 * ignore (proto.md). LIST with no query at all also lists it. */
int qk_nbd_query_matches_base_allocation(const char *q, uint32_t qlen, bool list);

#endif
