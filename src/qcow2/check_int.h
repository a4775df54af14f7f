/*
 * Shared state of the consistency check (check.c), the repair that drives
 * it (repair.c) and the refcount structure rebuild (refcount_rebuild.c):
 * the reference counts computed from the image's own tables, what kind
 * of thing references each cluster, and the clusters referenced past the
 * end of the file.
 */
#ifndef QK_QCOW2_CHECK_INT_H
#define QK_QCOW2_CHECK_INT_H

#include "qcow2/qcow2_int.h"

/* What references a cluster (bits of Check.kind). */
enum {
    CK_DATA = 1 << 0,     /* guest data (L2 entries), bitmap data */
    CK_META = 1 << 1,     /* header, L1/L2 tables, snapshot table, bitmap tables */
    CK_REFS = 1 << 2,     /* refcount table or block */
};

typedef struct Check {
    Qcow2State *s;
    QkCheckResult *res;
    QkCheckReport *report;
    void *opaque;
    uint32_t *refs;             /* computed references per cluster of the file, and one past it */
    uint8_t *kind;              /* CK_* per cluster */
    uint64_t nclusters;
    /* The slot past the file's clusters holds references (less than a
     * cluster past the end of the file); only the report looks at it. */
    bool slack;
    uint64_t file_len;
    /* Count everything but the refcount table and blocks (repair decides
     * separately whether they can be trusted). */
    bool skip_refcount_structure;
    /* Leave OFLAG_COPIED out of the check (repair counts those it fixes). */
    bool skip_copied;
    int copied_repaired;
    /* Clusters past the end of the file that something references: new
     * structures must never go there. */
    uint64_t *outside;
    size_t n_outside, cap_outside;
    bool outside_overflow;
    /* A structure that holds references (the snapshot table, a snapshot's
     * L1 table, the bitmap directory or a bitmap table) could not be read
     * whole: what it references is unknown, so a repair may raise
     * refcounts but never lower them. */
    bool partial;
    /* The end of the file cuts the snapshot table short (or it lies all
     * past it) between entries, in an entry's fixed part, or in an
     * entry's extra data or names with no room left for the entries
     * after it: only its first sn_whole entries are in the file. */
    bool sn_cut_short;
    uint32_t sn_whole;
    /* And the cut falls in entry sn_whole after its L1 table's offset
     * and size, which name a table in the file: where its fixed part ends
     * (0: not so; it may be before the end of the file when the cut is in
     * its extra data or names). -r all keeps the entry, nameless. */
    uint64_t sn_partial_end;
    /* Or it cuts the last entry's names short: where they end (0: not). */
    uint64_t sn_names_end;
    /* Where the file must end for every L2 table that starts inside it to
     * be whole (0: all are). */
    uint64_t short_end;
    uint32_t short_tables;
    /* -r all: unaligned preallocated (zero flag) entries become plain
     * zero entries while the references are counted. */
    bool fix_prealloc;
    uint32_t prealloc_bad;      /* found by the last walk */
    uint32_t prealloc_fixed;
    QkCheckReport *fix_report;  /* where those repairs are said */
    void *fix_opaque;
    /* Clusters whose stored refcount could not be read in the last
     * compare (each also a check error, as qemu-img counts them; a
     * rebuild can still repair them). */
    uint32_t rc_unreadable;
    /* The rebuild also switches the header's refcount_order (amend). */
    bool write_order;
} Check;

__attribute__((format(printf, 2, 3)))
void ck_say(Check *k, const char *fmt, ...);
/* Sizes the per-cluster arrays to the file as it is now. */
int ck_prepare(Check *k);
void ck_free(Check *k);
/* Computes k->refs from the image's tables, reporting what is malformed. */
int coroutine_fn ck_compute(Check *k);
/* One full check without changes: compute, compare, OFLAG_COPIED. Counts go
 * to res, lines to report (NULL: quiet). */
int coroutine_fn ck_run(Check *k, QkCheckResult *res, QkCheckReport *report, void *opaque);
/* The refcount stored for a cluster; false when it cannot be read. */
bool coroutine_fn ck_stored_rc(Check *k, uint64_t c, uint64_t *rc);
bool ck_table_ok(Check *k, uint64_t off, uint64_t len);
/* Reports (and counts into k->res) each OFLAG_COPIED flag of the active
 * tables that disagrees with its stored refcount. */
int coroutine_fn ck_check_copied(Check *k);

/* repair.c: repairs with fix flags, then checks again into res. */
int coroutine_fn ck_repair(Check *k, int fix, QkCheckResult *res, QkError *err);

/* refcount_rebuild.c: writes a new refcount table and blocks describing
 * k->refs (plus themselves) past everything in use, then switches the
 * header to them. The image is unchanged if it fails before the switch. */
int coroutine_fn ck_rebuild_refcounts(Check *k, QkError *err);
/* Makes OFLAG_COPIED of the active L1 and L2 entries say whether the
 * stored refcount is 1, once the refcounts are right and durable. */
int coroutine_fn ck_fix_copied(Check *k);
/* Rewrites the refcount structure with 2^order-bit entries (amend
 * refcount_bits), by the rebuild above: the header switches to the new
 * structure and width in one write. Refuses, unchanged, when the image
 * has errors or a refcount does not fit the new width; with dry, only
 * decides that (nothing written, the image may be read-only). */
int coroutine_fn qcow2_change_refcount_order(Qcow2State *s, uint32_t order, bool dry, QkError *err);

#endif
