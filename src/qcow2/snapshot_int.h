/*
 * Internal snapshots of the qcow2 driver, shared between snapshot_table.c
 * (the on-disk snapshot table), snapshot.c (create, apply, delete) and
 * vmstate.c (VM state beyond the virtual disk). Nothing outside src/qcow2
 * includes this; others reach snapshots through block/snapshot.h.
 */
#ifndef QK_QCOW2_SNAPSHOT_INT_H
#define QK_QCOW2_SNAPSHOT_INT_H

#include "block/snapshot.h"
#include "qcow2/qcow2_int.h"

/* nb_snapshots (u32 at 60) and snapshots_offset (u64 at 64) are adjacent,
 * so one 12-byte header write switches tables atomically. */
#define QCOW2_HOFF_SNAPSHOTS 60
/* size (24), crypt_method (32), l1_size (36), l1_table_offset (40): one
 * 24-byte write replaces the active L1 and the disk size together. */
#define QCOW2_HOFF_SIZE_AND_L1 24
#define QCOW2_SIZE_AND_L1_LEN 24

#define QCOW2_SN_FIXED_LEN 40
/* The extra data fields we know: VM state size, disk size, icount. */
#define QCOW2_SN_EXTRA_KNOWN 24
/* v3 images need extra data up to the disk size field. */
#define QCOW2_SN_EXTRA_V3_MIN 16
#define QCOW2_SN_MAX_EXTRA 1024

typedef struct Qcow2Snapshot {
    uint64_t l1_offset;
    uint32_t l1_size;
    char *id;
    char *name;
    uint32_t date_sec;
    uint32_t date_nsec;
    uint64_t vm_clock_nsec;
    uint64_t vm_state_size;
    uint64_t disk_size;
    int64_t icount;              /* -1: not recorded */
    uint8_t *extra_unknown;      /* extra data past the fields we know, kept */
    uint32_t extra_unknown_len;
    uint32_t extra_dropped;      /* capped read: extra bytes on disk, when cut to the limit */
    bool incomplete;             /* v3, and less extra data than the disk size needs (read as the image's size) */
    bool l1_bad;                 /* lenient read: the L1 table is not where it can be read */
} Qcow2Snapshot;

/* snapshot_table.c */
/* Reads and validates the table the header points to; *table_len (when
 * not NULL) gets its length in bytes on disk. */
int coroutine_fn qcow2_snapshots_read(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                      QkError *err);
/* The same, except that an entry with more extra data than QEMU's limit
 * is read with its extra data cut to the limit (extra_dropped set), as
 * check -r all keeps it; *capped counts such entries. */
int coroutine_fn qcow2_snapshots_read_capped(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                             uint32_t *capped, QkError *err);
/* The same, except that an entry whose L1 table lies outside the file
 * (or is unaligned, or too big) is kept with l1_bad set instead of
 * refusing the table: enough to list the snapshots and to delete such a
 * one (its clusters then leak), as qemu-img does. When the table itself
 * cannot be read, *table_len (when not NULL) still gets the length it
 * claims. */
int coroutine_fn qcow2_snapshots_read_lenient(Qcow2State *s, Qcow2Snapshot **out, uint32_t *n, uint64_t *table_len,
                                              QkError *err);
void qcow2_snapshots_free(Qcow2Snapshot *sn, uint32_t n);
/* Writes sn[0..n) to new clusters, makes the header point at them, then
 * frees the old table. A crash leaves the old or the new table, never a
 * mix; at worst clusters leak. */
int coroutine_fn qcow2_snapshots_write(Qcow2State *s, const Qcow2Snapshot *sn, uint32_t n, QkError *err);
/* check -r all, for a table the end of the file cuts short: the header
 * keeps only its first `keep` entries (all of them in the file; none: no
 * table), durable before the repair frees what the others referenced. */
int coroutine_fn qcow2_snapshots_cut(Qcow2State *s, uint32_t keep, QkError *err);
/* Tells the overlap check what the snapshot table and the snapshots' L1
 * tables occupy: a table that does not read is left to the snapshot
 * commands and check, but the bytes it claims stay protected. True when
 * it does not read because the end of the file cuts it short inside the
 * file's last cluster, where a growing file would make it read zeros. */
bool coroutine_fn qcow2_snapshots_protect(Qcow2State *s);
/* Index of the first snapshot whose id (when id) and name (when name)
 * match, or -1. */
int qcow2_snapshot_find(const Qcow2Snapshot *sn, uint32_t n, const char *id, const char *name);
/* Index of the snapshot whose id equals s, else whose name does, or -1. */
int qcow2_snapshot_find_id_or_name(const Qcow2Snapshot *sn, uint32_t n, const char *s);
/* The next free numeric id: one more than the largest numeric id. */
uint64_t qcow2_snapshot_next_id(const Qcow2Snapshot *sn, uint32_t n);

/* snapshot.c: the driver's snapshot calls (contracts in block/snapshot.h) */
int coroutine_fn qcow2_co_snapshot_list(QkBlock *bs, QkSnapshotInfo **list, int *n, QkError *err);
int coroutine_fn qcow2_co_snapshot_create(QkBlock *bs, const QkSnapshotInfo *info, QkError *err);
int coroutine_fn qcow2_co_snapshot_goto(QkBlock *bs, const char *id_or_name, uint64_t *vm_state_size,
                                        QkError *err);
int coroutine_fn qcow2_co_snapshot_delete(QkBlock *bs, const char *id, const char *name, QkError *err);
int coroutine_fn qcow2_co_snapshot_load_tmp(QkBlock *bs, const char *id, const char *name, QkError *err);
int coroutine_fn qcow2_co_vmstate_discard(QkBlock *bs, QkError *err);
/* Adds addend (+1, -1 or 0) to the refcount of every L2 table and data
 * cluster reachable from l1[0..n). With fix_copied, sets COPIED in l1 and
 * in the L2 entries exactly where the refcount is 1 (*l1_changed says
 * whether l1 changed). s->lock held. */
int coroutine_fn qcow2_walk_l1(Qcow2State *s, uint64_t *l1, uint64_t n, int addend, bool fix_copied,
                               bool *l1_changed);
/* Drops active L1 entries [from, l1_size) (the VM-state area) and their
 * clusters. s->lock held. */
int coroutine_fn qcow2_drop_l1_tail(Qcow2State *s, uint64_t from);
/* Writes the whole active L1 table in place; clears l1_dirty on success. */
/* Recomputes the active tree's COPIED flags when a snapshot operation
 * could not (copied_stale); called with the image quiescent (snapshot
 * operations, close). */
int coroutine_fn qcow2_fix_stale_copied(Qcow2State *s);
int coroutine_fn qcow2_rewrite_active_l1(Qcow2State *s);

/* vmstate.c */
uint64_t qcow2_vm_state_offset(const Qcow2State *s);
int coroutine_fn qcow2_co_save_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos);
int coroutine_fn qcow2_co_load_vmstate(QkBlock *bs, QkIov *qiov, uint64_t pos);

#endif
