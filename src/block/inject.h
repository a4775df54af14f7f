/*
 * Fault injection on the host file, for tests: rules make chosen writes or
 * flushes of protocol nodes fail with a chosen errno, as a failing disk or
 * a full file system would. Format drivers tag their metadata writes with
 * QK_REQ_KIND(kind) in the request flags, so a rule can pick "the 3rd write
 * of an L2 table" or "the 2nd flush".
 *
 * Rules (QCOWKIT_INJECT in the tools, or qk_inject_configure): a list
 * separated by ',' of OP[:nth=N][:errno=NAME][:mode=once|sticky|dead][:file=S]
 *   OP     write (any), data, header, l1, l2, reftable, refblock, snapshot, flush
 *   nth    the first operation to fail, counted from 1 per OP (default 1)
 *   errno  EIO (default), ENOSPC, EDQUOT, EROFS, EPERM or a number
 *   mode   once: only the nth fails (default); sticky: the nth and every
 *          later OP; dead: from the nth OP on, every write and flush fails
 *   file   only files whose path contains S (nth counts their OPs alone;
 *          a dead rule fails only them): the target of a mirror, say
 * "count" alone arms nothing and only counts.
 *
 * Owns: the rule set, per-kind operation counters, the decision to fail.
 * With no rule set a check costs one branch.
 */
#ifndef QK_BLOCK_INJECT_H
#define QK_BLOCK_INJECT_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"
#include "qcowkit/engine.h" /* qk_inject_configure, qk_inject_stats */

/* What a write to a host file holds. QK_IO_DATA (0) is the default, so
 * untagged writes count as data. */
typedef enum QkIoKind {
    QK_IO_DATA = 0,
    QK_IO_HEADER,
    QK_IO_L1,
    QK_IO_L2,
    QK_IO_REFTABLE,
    QK_IO_REFBLOCK,
    QK_IO_SNAPSHOT,
    QK_IO_BITMAP,
    QK_IO__KINDS,
} QkIoKind;

/* Request flag bits 8..11 carry the kind (see QK_REQ_* in block.h). */
#define QK_REQ_KIND_SHIFT 8
#define QK_REQ_KIND_MASK (0xf << QK_REQ_KIND_SHIFT)
#define QK_REQ_KIND(k) ((int)(k) << QK_REQ_KIND_SHIFT)

/* Operations a rule can target: the kinds above, then these. */
enum { QK_INJ_WRITE = QK_IO__KINDS, QK_INJ_FLUSH, QK_INJ__OPS };

/* Name of an operation ("l2", "flush", ...). */
const char *qk_inject_op_name(int op);
/* How many operations of op were seen, and how many faults were injected. */
uint64_t qk_inject_seen(int op);
uint64_t qk_inject_injected(void);

/* Called by protocol drivers before a write (flags of the request) or a
 * flush: 0, or the -errno the request must fail with. */
extern int qk_inject_on;
int qk_inject_write_slow(const char *file, int flags);
int qk_inject_flush_slow(const char *file);
static inline int qk_inject_write(const char *file, int flags)
{
    return qk_inject_on ? qk_inject_write_slow(file, flags) : 0;
}
static inline int qk_inject_flush(const char *file)
{
    return qk_inject_on ? qk_inject_flush_slow(file) : 0;
}

#endif
