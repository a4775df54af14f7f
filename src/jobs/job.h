/*
 * Long-running jobs (mirror, later convert and commit): one coroutine each
 * on the event loop, a state machine, progress, a speed limit, pause and
 * cancel, and a process-wide list for queries.
 *
 *   created -> running -> ready -> completed
 *                 |         |
 *                 +---------+--> cancelled | failed (with a message)
 *
 * A job's driver does the work in run(); it calls the pause point and the
 * sleep helper often, and reads cancel/complete requests from the job.
 * Owns: the lifecycle and bookkeeping. Must not know any job's own data.
 */
#ifndef QK_JOBS_JOB_H
#define QK_JOBS_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "aio/co_sync.h"
#include "aio/coroutine.h"
#include "util/error.h"
#include "util/ratelimit.h"
#include "qcowkit/engine.h" /* QkJob, QkJobState and the accessors */

typedef struct QkJobDriver {
    const char *type;              /* "mirror", ... */
    /* The work. Returns 0 when done, or -errno with err filled. A job that
     * notices a cancel request returns -ECANCELED. */
    int coroutine_fn (*run)(QkJob *job, QkError *err);
    /* Frees the driver's state around the job (the job is embedded in it). */
    void (*free)(QkJob *job);
} QkJobDriver;

/* Called once the job's run has returned, from the job's coroutine; it may
 * yield. The job counts as finished (qk_job_is_finished, waiters woken)
 * only after it returns, so its state still reads as before the end. */
typedef void QkJobFinishedFn(QkJob *job, void *opaque);

struct QkJob {
    char *id;
    const QkJobDriver *drv;
    QkJobState state;
    QkError err;                   /* set when failed */
    uint64_t bytes_done;
    uint64_t bytes_total;          /* estimate; may grow while running */
    uint64_t dirty_bytes;          /* for jobs that track a dirty set */
    uint64_t speed;                /* bytes/s, 0 unlimited */
    QkRateLimit limit;
    bool paused;
    bool cancel_requested;
    /* Set by the driver once it carries its result out: a cancel is then
     * refused, and a run that returns 0 completed whatever came after. */
    bool committed;
    bool complete_requested;
    int64_t start_ns, ready_ns, end_ns;
    int64_t start_cpu_ns, end_cpu_ns; /* process CPU time at start and end */
    QkCoQueue resume_waiters;
    QkCoQueue finish_waiters;
    unsigned waiters;              /* in qk_co_job_wait: the job must not be freed */
    QkJobFinishedFn *on_finished;
    void *finished_opaque;
    struct QkJob *next;
};

/* Initialises job (embedded at the start of the driver's struct) and adds it
 * to the list. id NULL: a fresh "jobN". Fails with -EEXIST for a taken id. */
int qk_job_init(QkJob *job, const QkJobDriver *drv, const char *id, QkError *err);
/* Starts the job's coroutine (state running). */
void qk_job_start(QkJob *job);

QkJob *qk_job_find(const char *id);
/* QEMU's rule for a job id: a letter, then letters, digits, '-', '.', '_'. */
bool qk_job_id_valid(const char *id);
QkJob *qk_job_first(void);
const char *qk_job_state_name(QkJobState s);
/* CPU time the whole process used since the job started (until it ended):
 * everything the process did, so the job's own cost only when nothing
 * else runs (a copy with no writer). */
int64_t qk_job_cpu_ns(const QkJob *job);

/* Requests. Each returns 0 or -errno with err filled. */
int qk_job_cancel(QkJob *job, QkError *err);
/* Only a ready job can be completed. */
int qk_job_complete(QkJob *job, QkError *err);
int qk_job_pause(QkJob *job, QkError *err);
int qk_job_resume(QkJob *job, QkError *err);
void qk_job_set_speed(QkJob *job, uint64_t speed);

/* Average bytes per second since the job started. */
double qk_job_throughput(const QkJob *job);

/* For drivers. */
void qk_job_set_ready(QkJob *job);
/* Waits while paused; returns true if the job should stop (cancelled). */
bool coroutine_fn qk_co_job_pause_point(QkJob *job);
/* Sleeps ns, waking early for cancel or complete requests. */
void coroutine_fn qk_co_job_sleep_ns(QkJob *job, int64_t ns);
/* Waits until the rate limit allows bytes, then charges them. */
void coroutine_fn qk_co_job_throttle(QkJob *job, uint64_t bytes);

/* Waits until the job has finished. */
void coroutine_fn qk_co_job_wait(QkJob *job);
/* The same, then until every other waiter has run again: after it the
 * job may be freed. */
void coroutine_fn qk_co_job_wait_to_free(QkJob *job);

#endif
