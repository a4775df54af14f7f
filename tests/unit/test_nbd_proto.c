/* NBD message parsing: request headers, NBD_OPT_INFO/GO payloads and meta
 * context requests, including every way a hostile length can lie. */
#include "qktest.h"
#include "nbd/proto.h"

#include <errno.h>
#include <string.h>

static uint32_t put_str(uint8_t *p, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    qk_be32_put(p, n);
    memcpy(p + 4, s, n);
    return 4 + n;
}

static unsigned nq;
static void count_query(void *opaque, const char *q, uint32_t len)
{
    (void)opaque;
    (void)q;
    (void)len;
    nq++;
}

int main(void)
{
    /* Request header. */
    uint8_t h[NBD_REQUEST_SIZE];
    qk_be32_put(h, NBD_REQUEST_MAGIC);
    qk_be16_put(h + 4, NBD_CMD_FLAG_FUA);
    qk_be16_put(h + 6, NBD_CMD_WRITE);
    qk_be64_put(h + 8, 0x1122334455667788ULL);
    qk_be64_put(h + 16, 1ULL << 40);
    qk_be32_put(h + 24, 4096);
    QkNbdRequest r;
    QK_CHECK_EQ(qk_nbd_parse_request(h, &r), 0);
    QK_CHECK_EQ(r.flags, NBD_CMD_FLAG_FUA);
    QK_CHECK_EQ(r.type, NBD_CMD_WRITE);
    QK_CHECK(r.cookie == 0x1122334455667788ULL);
    QK_CHECK(r.offset == 1ULL << 40);
    QK_CHECK_EQ(r.length, 4096);
    h[0] ^= 1;
    QK_CHECK_EQ(qk_nbd_parse_request(h, &r), -EINVAL);

    /* Replies. */
    uint8_t s[NBD_SIMPLE_REPLY_SIZE];
    qk_nbd_simple_reply(s, NBD_EPERM, 7);
    QK_CHECK_EQ(qk_be32_get(s), NBD_SIMPLE_REPLY_MAGIC);
    QK_CHECK_EQ(qk_be32_get(s + 4), NBD_EPERM);
    QK_CHECK(qk_be64_get(s + 8) == 7);
    uint8_t c[NBD_CHUNK_HEADER_SIZE];
    qk_nbd_chunk_header(c, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_OFFSET_HOLE, 9, 12);
    QK_CHECK_EQ(qk_be32_get(c), NBD_STRUCTURED_REPLY_MAGIC);
    QK_CHECK_EQ(qk_be16_get(c + 4), NBD_REPLY_FLAG_DONE);
    QK_CHECK_EQ(qk_be16_get(c + 6), NBD_REPLY_TYPE_OFFSET_HOLE);
    QK_CHECK_EQ(qk_be32_get(c + 16), 12);

    /* Errors on the wire use NBD's numbering. */
    QK_CHECK_EQ(qk_nbd_errno_to_wire(-EACCES), NBD_EPERM);
    QK_CHECK_EQ(qk_nbd_errno_to_wire(-EDQUOT), NBD_ENOSPC);
    QK_CHECK_EQ(qk_nbd_errno_to_wire(-EOPNOTSUPP), NBD_ENOTSUP);
    QK_CHECK_EQ(qk_nbd_errno_to_wire(-EUCLEAN), NBD_EIO);
    QK_CHECK_EQ(qk_nbd_errno_to_wire(0), 0);

    /* NBD_OPT_GO payload: name "disk", two info requests. */
    uint8_t g[64];
    uint32_t n = put_str(g, "disk");
    qk_be16_put(g + n, 2);
    qk_be16_put(g + n + 2, NBD_INFO_NAME);
    qk_be16_put(g + n + 4, NBD_INFO_BLOCK_SIZE);
    QkNbdInfoRequest ir;
    QK_CHECK_EQ(qk_nbd_parse_info_request(g, n + 6, &ir), 0);
    QK_CHECK_EQ(ir.name_len, 4);
    QK_CHECK(memcmp(ir.name, "disk", 4) == 0);
    QK_CHECK_EQ(ir.ninfos, 2);
    QK_CHECK_EQ(qk_be16_get(ir.infos + 2), NBD_INFO_BLOCK_SIZE);
    QK_CHECK_EQ(qk_nbd_parse_info_request(g, n + 5, &ir), -EINVAL);   /* short info list */
    QK_CHECK_EQ(qk_nbd_parse_info_request(g, n + 8, &ir), -EINVAL);   /* trailing bytes */
    QK_CHECK_EQ(qk_nbd_parse_info_request(g, 3, &ir), -EINVAL);
    qk_be32_put(g, 0xffffffffu);                                       /* name longer than message */
    QK_CHECK_EQ(qk_nbd_parse_info_request(g, n + 6, &ir), -EINVAL);
    qk_be32_put(g, 0);
    qk_be16_put(g + 4, 0);
    QK_CHECK_EQ(qk_nbd_parse_info_request(g, 6, &ir), 0);              /* default export, no infos */
    QK_CHECK_EQ(ir.name_len, 0);

    /* Meta context request: name, two queries. */
    uint8_t m[128];
    n = put_str(m, "disk");
    qk_be32_put(m + n, 2);
    n += 4;
    n += put_str(m + n, "base:allocation");
    n += put_str(m + n, "qemu:dirty-bitmap:x");
    QkNbdMetaRequest mr;
    nq = 0;
    QK_CHECK_EQ(qk_nbd_parse_meta_request(m, n, &mr, count_query, NULL), 0);
    QK_CHECK_EQ(mr.nqueries, 2);
    QK_CHECK_EQ(nq, 2);
    QK_CHECK_EQ(qk_nbd_parse_meta_request(m, n - 1, &mr, NULL, NULL), -EINVAL);
    QK_CHECK_EQ(qk_nbd_parse_meta_request(m, n + 1, &mr, NULL, NULL), -EINVAL);
    qk_be32_put(m + 8, 1000000); /* query count beyond the data */
    QK_CHECK_EQ(qk_nbd_parse_meta_request(m, n, &mr, NULL, NULL), -EINVAL);
    qk_be32_put(m + 8, 2);
    qk_be32_put(m + 12, 0xfffffff0u); /* query length wraps */
    QK_CHECK_EQ(qk_nbd_parse_meta_request(m, n, &mr, NULL, NULL), -EINVAL);

    QK_CHECK(qk_nbd_query_matches_base_allocation("base:", 5, true));
    QK_CHECK(!qk_nbd_query_matches_base_allocation("base:", 5, false)); /* SET ignores the bare namespace */
    QK_CHECK(qk_nbd_query_matches_base_allocation("base:allocation", 15, true));
    QK_CHECK(qk_nbd_query_matches_base_allocation("base:allocation", 15, false));
    QK_CHECK(!qk_nbd_query_matches_base_allocation("base:allocationX", 16, true));
    QK_CHECK(!qk_nbd_query_matches_base_allocation("qemu:", 5, true));
    QK_TEST_DONE();
}
