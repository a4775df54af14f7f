/*
 * The read path: walks the mapping extent by extent. Allocated data comes
 * from the file, zero clusters are zeros, unallocated ranges come from the
 * backing node (zeros past its end) or are zeros; compressed clusters are
 * inflated (zlib raw deflate or zstd).
 */
#include "qcow2/qcow2_int.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

static int inflate_zlib(const uint8_t *in, size_t inlen, uint8_t *out, size_t outlen)
{
    z_stream z;
    memset(&z, 0, sizeof(z));
    if (inflateInit2(&z, -12) != Z_OK) {
        return -ENOMEM;
    }
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)inlen;
    z.next_out = out;
    z.avail_out = (uInt)outlen;
    int r = inflate(&z, Z_FINISH);
    /* The compressed data may be followed by padding: a full cluster is enough. */
    bool ok = (r == Z_STREAM_END || r == Z_BUF_ERROR || r == Z_OK) && z.avail_out == 0;
    if (ok && r != Z_STREAM_END) {
        /* A stream that would inflate past the cluster is not one any
         * writer made (QEMU's reader takes the first cluster of it). */
        uint8_t extra;
        z.next_out = &extra;
        z.avail_out = 1;
        (void)inflate(&z, Z_FINISH);
        ok = z.avail_out == 1;
    }
    inflateEnd(&z);
    return ok ? 0 : -QK_ECORRUPT;
}

static int inflate_zstd(const uint8_t *in, size_t inlen, uint8_t *out, size_t outlen)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    if (!d) {
        return -ENOMEM;
    }
    ZSTD_inBuffer ib = {in, inlen, 0};
    ZSTD_outBuffer ob = {out, outlen, 0};
    int ret = 0;
    size_t r = 1;
    while (ob.pos < ob.size) {
        r = ZSTD_decompressStream(d, &ob, &ib);
        if (ZSTD_isError(r)) {
            ret = -QK_ECORRUPT;
            break;
        }
        if (ib.pos == ib.size && ob.pos < ob.size && r != 0) {
            ret = -QK_ECORRUPT; /* input ran out */
            break;
        }
        if (r == 0 && ob.pos < ob.size) {
            /* Frame done: another frame may follow. */
            if (ib.pos == ib.size) {
                ret = -QK_ECORRUPT;
                break;
            }
        }
    }
    if (ret == 0 && r != 0) {
        /* The frame goes on: it must not hold more than a cluster. */
        uint8_t extra;
        ZSTD_outBuffer xb = {&extra, 1, 0};
        size_t x = ZSTD_decompressStream(d, &xb, &ib);
        if (!ZSTD_isError(x) && xb.pos) {
            ret = -QK_ECORRUPT;
        }
    }
    ZSTD_freeDCtx(d);
    return ret;
}

static int coroutine_fn read_compressed(Qcow2State *s, uint64_t l2e, uint64_t in_cluster, uint64_t n,
                                        QkIov *qiov, size_t qoff)
{
    uint64_t host, len;
    qcow2_compressed_range(s, l2e, &host, &len);
    if (len > 2 * s->cluster_size + 512) {
        qcow2_note_corruption(s, "Compressed cluster at %#" PRIx64 " claims %" PRIu64 " bytes of compressed data, "
                              "more than two clusters", host, len);
        return -QK_ECORRUPT;
    }
    uint8_t *in = malloc(len);
    uint8_t *out = malloc(s->cluster_size);
    int r = in && out ? 0 : -ENOMEM;
    if (r == 0) {
        r = qk_co_pread(s->bs->file, host, len, in, 0);
    }
    if (r == 0) {
        r = s->h.compression_type == 1 ? inflate_zstd(in, len, out, s->cluster_size)
                                       : inflate_zlib(in, len, out, s->cluster_size);
    }
    if (r == -QK_ECORRUPT) {
        /* Named, as every other damage met on a read is. */
        qcow2_note_corruption(s, "Compressed cluster at %#" PRIx64 " (%" PRIu64 " bytes) cannot be decompressed",
                              host, len);
    }
    if (r == 0) {
        qk_iov_from_buf(qiov, qoff, out + in_cluster, n);
    }
    free(in);
    free(out);
    return r;
}

static int coroutine_fn read_backing(Qcow2State *s, uint64_t off, uint64_t n, QkIov *qiov, size_t qoff,
                                     int flags)
{
    QkBlock *b = s->bs->backing;
    int64_t blen = b ? qk_block_length(b) : 0;
    if (blen < 0) {
        return (int)blen;
    }
    uint64_t avail = off < (uint64_t)blen ? QK_MIN(n, (uint64_t)blen - off) : 0;
    if (avail) {
        int r = qk_co_preadv(b, off, avail, qiov, qoff, flags & QK_REQ_BULK_READ);
        if (r < 0) {
            return r;
        }
    }
    if (avail < n) {
        qk_iov_memset(qiov, qoff + avail, 0, n - avail);
    }
    return 0;
}

int coroutine_fn qcow2_read_unlocked(Qcow2State *s, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff,
                                     int flags)
{
    while (bytes) {
        Qcow2Extent ext;
        int r = qcow2_get_extent(s, off, bytes, &ext);
        if (r < 0) {
            return r;
        }
        uint64_t n = ext.bytes;
        switch (ext.type) {
        case QCOW2_UNALLOC:
            r = read_backing(s, off, n, qiov, qoff, flags);
            break;
        case QCOW2_ZERO_PLAIN:
        case QCOW2_ZERO_ALLOC:
            qk_iov_memset(qiov, qoff, 0, n);
            break;
        case QCOW2_NORMAL:
            r = qk_co_preadv(s->data, ext.host, n, qiov, qoff, flags & QK_REQ_BULK_READ);
            break;
        case QCOW2_COMPRESSED:
            r = read_compressed(s, ext.l2e, off & (s->cluster_size - 1), n, qiov, qoff);
            break;
        }
        if (r < 0) {
            return r;
        }
        off += n;
        qoff += n;
        bytes -= n;
    }
    return 0;
}

int coroutine_fn qcow2_co_preadv(QkBlock *bs, uint64_t off, uint64_t bytes, QkIov *qiov, size_t qoff, int flags)
{
    Qcow2State *s = qcow2_state(bs);
    Qcow2Req req;
    qcow2_req_begin(s, &req, off, off + bytes, false);
    int r = qcow2_read_unlocked(s, off, bytes, qiov, qoff, flags);
    qcow2_req_end(s, &req);
    return r;
}
