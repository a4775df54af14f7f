/*
 * Job lifecycle (see job.h). Sleeping is done in short slices so cancel and
 * complete requests are noticed within a few milliseconds without needing
 * a timer that can be cut short.
 */
#include "jobs/job.h"
#include "aio/loop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLICE_NS 5000000LL
#define BURST_NS 100000000LL

static int64_t process_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) {
        return 0;
    }
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int64_t qk_job_cpu_ns(const QkJob *job)
{
    int64_t end = job->end_cpu_ns ? job->end_cpu_ns : process_cpu_ns();
    return end > job->start_cpu_ns ? end - job->start_cpu_ns : 0;
}

static QkJob *job_list;
static unsigned job_counter;

static const char *const state_names[] = {
    [QK_JOB_CREATED] = "created",
    [QK_JOB_RUNNING] = "running",
    [QK_JOB_READY] = "ready",
    [QK_JOB_COMPLETED] = "completed",
    [QK_JOB_CANCELLED] = "cancelled",
    [QK_JOB_FAILED] = "failed",
};

const char *qk_job_state_name(QkJobState s)
{
    return (unsigned)s < sizeof(state_names) / sizeof(state_names[0]) ? state_names[s] : "unknown";
}

QkJob *qk_job_find(const char *id)
{
    for (QkJob *j = job_list; j; j = j->next) {
        if (strcmp(j->id, id) == 0) {
            return j;
        }
    }
    return NULL;
}

QkJob *qk_job_first(void)
{
    return job_list;
}

bool qk_job_id_valid(const char *id)
{
    if (!((id[0] >= 'a' && id[0] <= 'z') || (id[0] >= 'A' && id[0] <= 'Z'))) {
        return false;
    }
    return id[strspn(id, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")] == '\0';
}

int qk_job_init(QkJob *job, const QkJobDriver *drv, const char *id, QkError *err)
{
    char buf[32];
    if (id && !qk_job_id_valid(id)) {
        return qk_error_set(err, -EINVAL, "Invalid job ID '%s'", id);
    }
    if (!id) {
        do {
            snprintf(buf, sizeof(buf), "job%u", job_counter++);
        } while (qk_job_find(buf));
        id = buf;
    } else if (qk_job_find(id)) {
        return qk_error_set(err, -EEXIST, "Job ID '%s' is already in use", id);
    }
    memset(job, 0, sizeof(*job));
    job->id = strdup(id);
    if (!job->id) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    job->drv = drv;
    job->state = QK_JOB_CREATED;
    qk_ratelimit_init(&job->limit, 0, BURST_NS);
    qk_co_queue_init(&job->resume_waiters);
    qk_co_queue_init(&job->finish_waiters);
    job->next = job_list;
    job_list = job;
    return 0;
}

QkJobState qk_job_state(const QkJob *job)
{
    return job->state;
}

const char *qk_job_error(const QkJob *job)
{
    return job->state == QK_JOB_FAILED ? job->err.msg : "";
}

void qk_job_progress(const QkJob *job, uint64_t *done, uint64_t *total)
{
    *done = job->bytes_done;
    *total = job->bytes_total;
}

bool qk_job_is_finished(const QkJob *job)
{
    return job->state == QK_JOB_COMPLETED || job->state == QK_JOB_CANCELLED ||
           job->state == QK_JOB_FAILED;
}

static void coroutine_fn job_entry(void *opaque)
{
    QkJob *job = opaque;
    QkError err = {0};
    int r = job->drv->run(job, &err);
    job->end_ns = qk_clock_ns();
    job->end_cpu_ns = process_cpu_ns();
    QkJobState final;
    /* A driver returns 0 only when it carried the job out (a cancel it
     * honoured is -ECANCELED), whatever cancel came in meanwhile. */
    if (r == 0) {
        final = QK_JOB_COMPLETED;
    } else if (r == -ECANCELED) {
        final = QK_JOB_CANCELLED;
    } else {
        final = QK_JOB_FAILED;
        if (!err.code) {
            qk_error_set_errno(&err, r < 0 ? r : -EIO, "job failed");
        }
        job->err = err;
    }
    /* The hook may yield (the daemon's closes images). The job becomes
     * finished only after it returns: a waiter that saw it finished could
     * dismiss it and free the job and the hook's context under the hook. */
    if (job->on_finished) {
        job->on_finished(job, job->finished_opaque);
    }
    job->state = final;
    qk_co_queue_wake_all(&job->finish_waiters);
}

void qk_job_start(QkJob *job)
{
    job->state = QK_JOB_RUNNING;
    job->start_ns = qk_clock_ns();
    job->start_cpu_ns = process_cpu_ns();
    qk_coroutine_wake(qk_coroutine_create(job_entry, job));
}

void qk_job_free(QkJob *job)
{
    for (QkJob **pp = &job_list; *pp; pp = &(*pp)->next) {
        if (*pp == job) {
            *pp = job->next;
            break;
        }
    }
    free(job->id);
    job->id = NULL;
    if (job->drv->free) {
        job->drv->free(job);
    }
}

int qk_job_cancel(QkJob *job, QkError *err)
{
    if (qk_job_is_finished(job)) {
        return qk_error_set(err, -EINVAL, "Job '%s' has already finished", job->id);
    }
    if (job->committed) {
        return qk_error_set(err, -EBUSY, "Job '%s' is completing and can no longer be cancelled", job->id);
    }
    job->cancel_requested = true;
    job->paused = false;
    qk_co_queue_wake_all(&job->resume_waiters);
    return 0;
}

int qk_job_complete(QkJob *job, QkError *err)
{
    if (job->paused) {
        /* QEMU's rule: a paused job would not finish, and whoever waits
         * for the completion would wait until it is resumed. */
        return qk_error_set(err, -EBUSY, "Job '%s' in state 'paused' cannot accept command verb 'complete'",
                            job->id);
    }
    if (job->state != QK_JOB_READY) {
        return qk_error_set(err, -EBUSY, "Job '%s' in state '%s' cannot be completed (not ready)",
                            job->id, qk_job_state_name(job->state));
    }
    job->complete_requested = true;
    return 0;
}

int qk_job_pause(QkJob *job, QkError *err)
{
    if (qk_job_is_finished(job)) {
        return qk_error_set(err, -EINVAL, "Job '%s' has already finished", job->id);
    }
    job->paused = true;
    return 0;
}

int qk_job_resume(QkJob *job, QkError *err)
{
    if (!job->paused) {
        return qk_error_set(err, -EINVAL, "Job '%s' is not paused", job->id);
    }
    job->paused = false;
    qk_co_queue_wake_all(&job->resume_waiters);
    return 0;
}

void qk_job_set_speed(QkJob *job, uint64_t speed)
{
    job->speed = speed;
    qk_ratelimit_set_speed(&job->limit, speed);
}

double qk_job_throughput(const QkJob *job)
{
    int64_t end = qk_job_is_finished(job) ? job->end_ns : qk_clock_ns();
    double s = (double)(end - job->start_ns) / 1e9;
    return s > 0 ? (double)job->bytes_done / s : 0.0;
}

void qk_job_set_ready(QkJob *job)
{
    if (job->state == QK_JOB_RUNNING) {
        job->state = QK_JOB_READY;
        job->ready_ns = qk_clock_ns();
    }
}

bool coroutine_fn qk_co_job_pause_point(QkJob *job)
{
    while (job->paused && !job->cancel_requested) {
        qk_co_queue_wait(&job->resume_waiters);
    }
    return job->cancel_requested;
}

void coroutine_fn qk_co_job_sleep_ns(QkJob *job, int64_t ns)
{
    int64_t until = qk_clock_ns() + ns;
    bool complete = job->complete_requested;
    for (;;) {
        int64_t left = until - qk_clock_ns();
        if (left <= 0 || job->cancel_requested || job->complete_requested != complete) {
            return;
        }
        qk_co_sleep_ns(left < SLICE_NS ? left : SLICE_NS);
    }
}

void coroutine_fn qk_co_job_throttle(QkJob *job, uint64_t bytes)
{
    int64_t d;
    while ((d = qk_ratelimit_delay(&job->limit, qk_clock_ns())) > 0 && !job->cancel_requested) {
        qk_co_job_sleep_ns(job, d);
    }
    qk_ratelimit_charge(&job->limit, bytes, qk_clock_ns());
}

void coroutine_fn qk_co_job_wait(QkJob *job)
{
    /* Counted until the waiter runs again: whoever frees a finished job
     * (dismiss) must let the waiters woken by its end look at it first. */
    job->waiters++;
    while (!qk_job_is_finished(job)) {
        qk_co_queue_wait(&job->finish_waiters);
    }
    job->waiters--;
}

void coroutine_fn qk_co_job_wait_to_free(QkJob *job)
{
    qk_co_job_wait(job);
    while (job->waiters) {
        qk_co_sleep_ns(1000 * 1000);
    }
}
