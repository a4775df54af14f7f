/*
 * Public-to-the-tools part of the qcow2 driver: consistency check and
 * repair. Everything else, internal snapshots included, is reached
 * through the block layer.
 */
#ifndef QK_QCOW2_QCOW2_H
#define QK_QCOW2_QCOW2_H

#include <stdbool.h>
#include <stdint.h>

#include "block/block.h"

enum {
    QK_CHECK_FIX_LEAKS = 1 << 0,
    QK_CHECK_FIX_ERRORS = 1 << 1,
};

typedef struct QkCheckResult {
    int corruptions;          /* still present after the check */
    int leaks;
    int check_errors;         /* the check itself could not read something */
    int corruptions_fixed;
    int leaks_fixed;
    uint64_t image_end_offset;
    uint64_t total_clusters;       /* clusters of guest data the image can map */
    uint64_t allocated_clusters;
    uint64_t fragmented_clusters;
    uint64_t compressed_clusters;
} QkCheckResult;

/* Receives one line of the check's report (no trailing newline), e.g.
 * "Leaked cluster 5 refcount=1 reference=0" or "ERROR cluster 3 refcount=0 reference=1". */
typedef void QkCheckReport(void *opaque, const char *line);

/* Checks (and with fix flags repairs) a qcow2 node opened read-write when
 * fix != 0. Returns 0 when the check ran (result says what it found), or
 * -errno when it could not complete. */
int coroutine_fn qk_qcow2_co_check(QkBlock *bs, int fix, QkCheckResult *res,
                                   QkCheckReport *report, void *opaque, QkError *err);
bool qk_block_is_qcow2(const QkBlock *bs);

#endif
