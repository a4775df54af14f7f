/* A job's final state tells what it did (jobs/job.c): a cancel that
 * arrives after the driver has committed its result is refused, and a
 * run that returns 0 is "completed" even when a cancel came in while it
 * finished (a backup had then already consumed its bitmap, a mirror
 * moved its users); a cancel the driver honours is "cancelled". */
#include "qktest.h"
#include "jobs/job.h"

#include <errno.h>
#include <stdlib.h>

typedef struct Fake {
    QkJob job;
    bool commit;        /* commit before the finishing step */
    bool honour;        /* return -ECANCELED when a cancel was asked */
    bool in_finish;     /* inside the finishing step */
} Fake;

static int coroutine_fn fake_run(QkJob *job, QkError *err)
{
    Fake *f = (Fake *)job;
    (void)err;
    if (f->commit) {
        job->committed = true;
    }
    f->in_finish = true;
    qk_co_sleep_ns(20 * 1000 * 1000); /* the finishing step yields (a flush) */
    f->in_finish = false;
    return f->honour && job->cancel_requested ? -ECANCELED : 0;
}

static void fake_free(QkJob *job)
{
    (void)job;
}

static const QkJobDriver fake_driver = {.type = "fake", .run = fake_run, .free = fake_free};

typedef struct Case {
    bool commit, honour;
    int cancel_ret;
    QkJobState want;
} Case;

static void coroutine_fn run_case(void *opaque)
{
    Case *c = opaque;
    Fake *f = calloc(1, sizeof(*f));
    QkError err = {0};
    QK_CHECK_EQ(qk_job_init(&f->job, &fake_driver, "j", &err), 0);
    f->commit = c->commit;
    f->honour = c->honour;
    qk_job_start(&f->job);
    while (!f->in_finish) {
        qk_co_sleep_ns(1000 * 1000);
    }
    QkError cerr = {0};
    QK_CHECK_EQ(qk_job_cancel(&f->job, &cerr), c->cancel_ret);
    qk_co_job_wait_to_free(&f->job);
    if (qk_job_state(&f->job) != c->want) {
        fprintf(stderr, "commit %d honour %d: state %s\n", c->commit, c->honour,
                qk_job_state_name(qk_job_state(&f->job)));
    }
    QK_CHECK_EQ(qk_job_state(&f->job), c->want);
    qk_job_free(&f->job);
    free(f);
}

int main(void)
{
    Case cases[] = {
        /* Committed: the cancel is refused, the job completes. */
        {.commit = true, .honour = true, .cancel_ret = -EBUSY, .want = QK_JOB_COMPLETED},
        /* Not committed, and the driver finishes anyway: completed, as it is. */
        {.commit = false, .honour = false, .cancel_ret = 0, .want = QK_JOB_COMPLETED},
        /* Not committed, and the driver stops for the cancel. */
        {.commit = false, .honour = true, .cancel_ret = 0, .want = QK_JOB_CANCELLED},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        qk_co_run(run_case, &cases[i]);
    }
    QK_TEST_DONE();
}
