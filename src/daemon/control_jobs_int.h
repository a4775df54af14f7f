/*
 * What the job commands share (control_jobs.c, control_backup.c): the
 * daemon's record of a job around the job itself, and the steps every job
 * start takes.
 */
#ifndef QK_DAEMON_CONTROL_JOBS_INT_H
#define QK_DAEMON_CONTROL_JOBS_INT_H

#include "daemon/control.h"
#include "jobs/job.h"

/* What the daemon keeps for a job besides the job itself. */
typedef struct JobCtx {
    QkDaemon *d;
    QkJob *job;
    char *export_name;
    QkBlock *source;         /* the export's node when the job started */
    QkBlock *target;         /* ours to close unless the export took it */
    bool switched;
    const char *target_cache; /* the cache mode the target was opened with */
    char *view_export;       /* a backup's point-in-time export, removed when the job ends */
    char *temp_file;         /* removed when the job ends */
    struct JobCtx *next;
} JobCtx;

JobCtx *qk_control_job_ctx(QkJob *job);
void qk_control_job_ctx_free(JobCtx *c);
/* What every job start checks first: the export (returned), a free job
 * id, the target's cache mode, no other job on the export, and a target
 * that is not the export's own image. */
QkNbdExport *qk_control_job_check_args(QkDaemon *d, const char *exp_name, const char *id, const char *tcache,
                                       const char *target, QkError *err);
/* Opens a job's target and records the job's context for the export
 * (registered, so a second job on it is refused while this one starts).
 * Returns NULL with err set; the target is closed again then. */
JobCtx *coroutine_fn qk_control_job_open_target(QkDaemon *d, const char *exp_name, const char *target,
                                                const char *format, const char *tcache, QkError *err);
/* Hands the context to a job that started (returns {"id": ...}), or
 * undoes it when job is NULL. */
json_t *coroutine_fn qk_control_job_attach(JobCtx *c, QkJob *job);

#endif
