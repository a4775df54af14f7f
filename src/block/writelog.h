/*
 * Write log for crash-state testing, in the manner of Linux dm-log-writes.
 * When the environment variable QCOWKIT_LOG_WRITES names a file, every host
 * file opened read-write by the file driver records what the engine does to
 * it: writes (with their data), write-zeroes, discards, truncates and
 * flushes. A replay tool (tests/crash/) rebuilds from the log every state a
 * crash could leave on disk.
 *
 * Records are appended in completion order: a write is logged when it has
 * completed, a flush twice (FLUSH_BEGIN when it is issued, FLUSH_END when it
 * completes). A completed flush makes durable exactly the writes logged
 * before its FLUSH_BEGIN; writes logged after it may or may not be on disk.
 * Logging a write late (after the loop saw its completion) is conservative.
 *
 * Format (little-endian): a sequence of records, each a 40-byte header
 *   u32 magic 'QKWL', u16 type, u16 flags, u32 file, u32 pid,
 *   u64 seq, u64 off, u64 len
 * followed by len bytes of payload for WRITE (the data), OPEN (the file's
 * real path) and MARK (a caller's text). TRUNCATE carries the new size in
 * off; FLUSH_BEGIN/FLUSH_END carry the flush id in off and FLUSH_END the
 * result (0 or -errno) in len. `file` tells host files apart within one
 * process (OPEN names it); seq orders records across all files.
 *
 * Owns: the log file descriptor and the record format.
 */
#ifndef QK_BLOCK_WRITELOG_H
#define QK_BLOCK_WRITELOG_H

#include <stdint.h>
#include <sys/uio.h>

#include "util/error.h"
#include "qcowkit/engine.h" /* qk_write_log_mark */

#define QK_WRITE_LOG_ENV "QCOWKIT_LOG_WRITES"
#define QK_WRITE_LOG_MAGIC 0x4c574b51u /* "QKWL" */

typedef enum QkWriteLogType {
    QK_WLOG_OPEN = 1,
    QK_WLOG_WRITE = 2,
    QK_WLOG_ZERO = 3,        /* flags: QK_WLOG_F_UNMAP when a hole was punched */
    QK_WLOG_DISCARD = 4,     /* punched hole; does not extend the file */
    QK_WLOG_TRUNCATE = 5,
    QK_WLOG_FLUSH_BEGIN = 6,
    QK_WLOG_FLUSH_END = 7,
    QK_WLOG_MARK = 8,
} QkWriteLogType;

enum {
    QK_WLOG_F_UNMAP = 1 << 0,
    QK_WLOG_F_FUA = 1 << 1,  /* the flush pair that follows came from a FUA write */
};

typedef struct QkWriteLog QkWriteLog;

/* For a host file just opened read-write: returns 0 with *out NULL when
 * logging is off, 0 with a handle when on (an OPEN record is written), or
 * -errno with err set when the log cannot be written. */
int qk_write_log_attach(const char *filename, QkWriteLog **out, QkError *err);
void qk_write_log_detach(QkWriteLog *l);

/* Each returns 0 or -errno; a request whose record cannot be written
 * fails, so a test never replays a log with holes in it. */
int qk_write_log_data(QkWriteLog *l, uint64_t off, const struct iovec *iov, int niov, uint64_t bytes);
int qk_write_log_op(QkWriteLog *l, QkWriteLogType type, int flags, uint64_t off, uint64_t len);
/* Logs FLUSH_BEGIN and returns the flush id (> 0), or -errno. */
int64_t qk_write_log_flush_begin(QkWriteLog *l, int flags);
int qk_write_log_flush_end(QkWriteLog *l, int64_t id, int result);

#endif
