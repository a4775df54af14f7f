/*
 * Control commands for long-running jobs: mirror-start, query-jobs,
 * job-complete (optionally switching the export to the target), job-cancel,
 * job-set-speed, job-pause, job-resume, job-dismiss (the backup commands
 * are in control_backup.c).
 *
 * Owns: the JSON shape of jobs and the nodes a job opened (the mirror
 * target until the switch, then the old source until the job ends). Must
 * not know the socket framing.
 */
#include "daemon/control_jobs_int.h"
#include "aio/loop.h"
#include "block/dirty_bitmap.h"
#include "jobs/backup.h"
#include "jobs/mirror.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static JobCtx *contexts;

JobCtx *qk_control_job_ctx(QkJob *job)
{
    for (JobCtx *c = contexts; c; c = c->next) {
        if (c->job == job) {
            return c;
        }
    }
    return NULL;
}

void qk_control_job_ctx_free(JobCtx *c)
{
    for (JobCtx **pp = &contexts; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    free(c->export_name);
    free(c->view_export);
    free(c->temp_file);
    free(c);
}

const char *qk_control_export_job(const char *name)
{
    /* source and target are cleared once the job no longer uses them. */
    for (JobCtx *c = contexts; c; c = c->next) {
        if ((c->source || c->target) &&
            (strcmp(c->export_name, name) == 0 || (c->view_export && strcmp(c->view_export, name) == 0))) {
            return c->job ? c->job->id : "(starting)";
        }
    }
    return NULL;
}

/* Refuses a second job on an export: when one switched the export to its
 * target, the other's source would be closed under it. */
static int check_export_idle(const char *name, QkError *err)
{
    const char *busy = qk_control_export_job(name);
    if (busy) {
        return qk_error_set(err, -EBUSY, "Export '%s' is in use by job '%s'", name, busy);
    }
    return 0;
}

static QkJob *find_job(json_t *args, QkError *err)
{
    const char *id;
    if (qk_control_arg_string(args, "id", true, &id, err) < 0) {
        return NULL;
    }
    QkJob *job = qk_job_find(id);
    if (!job) {
        qk_error_set(err, -ENOENT, "Job '%s' not found", id);
    }
    return job;
}

/* Refuses a target that is a file of the export's own node or chain: a
 * second read-write opening of an image in use corrupts it (nothing locks
 * images against another opener yet). */
static int check_target_not_source(QkBlock *src, const char *target, QkError *err)
{
    struct stat t, n;
    if (!target || qk_block_is_remote(target) || stat(target, &t) != 0) {
        return 0;
    }
    for (QkBlock *b = src; b; b = b->backing) {
        for (QkBlock *f = b; f; f = f->file) {
            if (f->filename && stat(f->filename, &n) == 0 && n.st_dev == t.st_dev && n.st_ino == t.st_ino) {
                return qk_error_set(err, -EBUSY, "Target '%s' is the export's image or one of its backing files",
                                    target);
            }
        }
    }
    return 0;
}

/* Under quiesce of the source: the export now serves the target. */
static void switch_export(void *opaque, QkBlock *source, QkBlock *target)
{
    JobCtx *c = opaque;
    QkNbdExport *e = qk_nbd_server_find_export(qk_daemon_nbd_server(c->d), c->export_name);
    if (e && e->bs == source) {
        qk_nbd_export_set_node(qk_daemon_nbd_server(c->d), e, target);
        c->switched = true;
    }
}

/* From the job's coroutine once it has ended: close what is ours. */
static void coroutine_fn job_finished(QkJob *job, void *opaque)
{
    (void)job;
    JobCtx *c = opaque;
    if (c->view_export) {
        /* Its node reads through the job: it goes before the target. */
        QkError e = {0};
        qk_co_nbd_server_del_export(qk_daemon_nbd_server(c->d), c->view_export, &e);
    }
    if (c->switched) {
        qk_co_block_close(c->source);
    } else {
        qk_co_block_close(c->target);
    }
    c->source = c->target = NULL;
    if (c->temp_file) {
        unlink(c->temp_file);
    }
}

/* What every job start checks first: the export (returned), a free job
 * id, the target's cache mode, no other job on the export, and a target
 * that is not the export's own image. */
QkNbdExport *qk_control_job_check_args(QkDaemon *d, const char *exp_name, const char *id, const char *tcache,
                                   const char *target, QkError *err)
{
    QkNbdExport *e = qk_nbd_server_find_export(qk_daemon_nbd_server(d), exp_name);
    if (!e) {
        qk_error_set(err, -ENOENT, "Export '%s' not found", exp_name);
        return NULL;
    }
    if (id && !qk_job_id_valid(id)) {
        qk_error_set(err, -EINVAL, "Invalid job ID '%s'", id);
        return NULL;
    }
    if (id && qk_job_find(id)) {
        qk_error_set(err, -EEXIST, "Job ID '%s' is already in use", id);
        return NULL;
    }
    int dummy = 0;
    if (tcache && qk_cache_mode_parse(tcache, &dummy) < 0) {
        qk_error_set(err, -EINVAL, "Parameter 'target-cache' expects none, writeback, writethrough, directsync or unsafe");
        return NULL;
    }
    if (check_export_idle(exp_name, err) < 0 || check_target_not_source(e->bs, target, err) < 0) {
        return NULL;
    }
    return e;
}

/* Opens a job's target and records the job's context for the export
 * (registered, so a second job on it is refused while this one starts).
 * Returns NULL with err set; the target is closed again then. */
JobCtx *coroutine_fn qk_control_job_open_target(QkDaemon *d, const char *exp_name, const char *target,
                                            const char *format, const char *tcache, QkError *err)
{
    QkOpenOptions to = {.flags = QK_OPEN_RDWR, .format = format};
    const char *tcache_used;
    QkBlock *tbs = qk_mirror_open_target(target, &to, tcache, &tcache_used, err);
    if (!tbs) {
        qk_error_prefix(err, "Could not open target '%s'", target);
        return NULL;
    }
    /* The export may have gone, or another job taken it, while we yielded. */
    QkNbdExport *e = qk_nbd_server_find_export(qk_daemon_nbd_server(d), exp_name);
    if (e && check_export_idle(exp_name, err) < 0) {
        qk_co_block_close(tbs);
        return NULL;
    }
    JobCtx *c = calloc(1, sizeof(*c));
    if (!e || !c || !(c->export_name = strdup(exp_name))) {
        free(c);
        qk_co_block_close(tbs);
        qk_error_set(err, e ? -ENOMEM : -ENOENT, e ? "out of memory" : "Export '%s' is gone", exp_name);
        return NULL;
    }
    c->d = d;
    c->source = e->bs;
    c->target = tbs;
    c->target_cache = tcache_used; /* a static string */
    c->next = contexts;
    contexts = c;
    return c;
}

/* Hands the context to a job that started, or undoes it. */
json_t *coroutine_fn qk_control_job_attach(JobCtx *c, QkJob *job)
{
    if (!job) {
        QkBlock *tbs = c->target;
        qk_control_job_ctx_free(c);
        qk_co_block_close(tbs);
        return NULL;
    }
    c->job = job;
    job->on_finished = job_finished;
    job->finished_opaque = c;
    return json_pack("{s:s}", "id", job->id);
}

static json_t *coroutine_fn cmd_mirror_start(QkDaemon *d, json_t *args, QkError *err)
{
    const char *exp_name, *target, *format, *id, *mode, *prio, *tcache;
    QkMirrorOptions o = {0};
    uint64_t in_flight = 0;
    if (qk_control_arg_string(args, "export", true, &exp_name, err) < 0 ||
        qk_control_arg_string(args, "target", true, &target, err) < 0 ||
        qk_control_arg_string(args, "format", false, &format, err) < 0 ||
        qk_control_arg_string(args, "id", false, &id, err) < 0 ||
        qk_control_arg_string(args, "mode", false, &mode, err) < 0 ||
        qk_control_arg_string(args, "copy-priority", false, &prio, err) < 0 ||
        qk_control_arg_string(args, "target-cache", false, &tcache, err) < 0 ||
        qk_control_arg_size(args, "speed", &o.speed, err) < 0 ||
        qk_control_arg_size(args, "granularity", &o.granularity, err) < 0 ||
        qk_control_arg_size(args, "buf-size", &o.buf_size, err) < 0 ||
        qk_control_arg_size(args, "max-in-flight", &in_flight, err) < 0 ||
        qk_control_arg_size(args, "ready-threshold", &o.ready_threshold, err) < 0 ||
        qk_control_arg_bool(args, "rescan-per-chunk", &o.rescan_per_chunk, err) < 0 ||
        qk_control_arg_bool(args, "chase-writes", &o.chase_writes, err) < 0) {
        return NULL;
    }
    if (mode && qk_mirror_mode_parse(mode, &o.mode) < 0) {
        qk_error_set(err, -EINVAL, "Parameter 'mode' expects 'background' or 'write-blocking'");
        return NULL;
    }
    if (prio && qk_mirror_priority_parse(prio, &o.copy_priority) < 0) {
        qk_error_set(err, -EINVAL, "Parameter 'copy-priority' expects 'low', 'normal' or 'auto'");
        return NULL;
    }
    if (in_flight > 1024) {
        qk_error_set(err, -EINVAL, "Parameter 'max-in-flight' must be at most 1024");
        return NULL;
    }
    o.max_in_flight = (int)in_flight;
    QkNbdExport *e = qk_control_job_check_args(d, exp_name, id, tcache, target, err);
    if (!e) {
        return NULL;
    }
    /* A local target that does not exist yet is created like the source. */
    struct stat sb;
    if (!qk_block_is_remote(target) && stat(target, &sb) != 0) {
        QkCreateOptions co = {.format = format ? format : "qcow2",
                              .size = (uint64_t)qk_block_length(e->bs), .size_set = true};
        if (qk_co_block_create(target, &co, err) < 0) {
            qk_error_prefix(err, "Could not create '%s'", target);
            return NULL;
        }
        o.target_is_zero = true;
    }
    JobCtx *c = qk_control_job_open_target(d, exp_name, target, format, tcache, err);
    if (!c) {
        return NULL;
    }
    o.switch_fn = switch_export;
    o.switch_opaque = c;
    return qk_control_job_attach(c, qk_mirror_start(id, c->source, c->target, &o, err));
}

static json_t *job_json(QkJob *job)
{
    json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I}",
                          "id", job->id,
                          "type", job->drv->type,
                          "status", qk_job_state_name(job->state),
                          "bytes-done", (json_int_t)job->bytes_done,
                          "bytes-total", (json_int_t)job->bytes_total,
                          "dirty-bytes", (json_int_t)job->dirty_bytes,
                          "throughput", (json_int_t)qk_job_throughput(job),
                          "speed", (json_int_t)job->speed);
    if (!o) {
        return NULL;
    }
    if (job->ready_ns) {
        json_object_set_new(o, "ms-to-ready", json_integer((job->ready_ns - job->start_ns) / 1000000));
    }
    if (qk_job_is_finished(job)) {
        json_object_set_new(o, "ms-total", json_integer((job->end_ns - job->start_ns) / 1000000));
    }
    if (job->state == QK_JOB_FAILED) {
        json_object_set_new(o, "error", json_string(job->err.msg));
    }
    if (job->paused) {
        json_object_set_new(o, "paused", json_true());
    }
    /* The process's CPU since the job started (see qk_job_cpu_ns). */
    int64_t cpu = qk_job_cpu_ns(job);
    json_object_set_new(o, "cpu-ms", json_integer(cpu / 1000000));
    if (job->bytes_done) {
        json_object_set_new(o, "cpu-ms-per-gib",
                            json_integer((json_int_t)((double)cpu / 1e6 * (double)(1ULL << 30) / (double)job->bytes_done)));
    }
    if (qk_job_is_backup(job)) {
        QkBackupStats st;
        qk_backup_get_stats(job, &st);
        json_object_set_new(o, "granularity", json_integer((json_int_t)st.granularity));
        json_object_set_new(o, "cbw-copies", json_integer((json_int_t)st.cbw_copies));
        json_object_set_new(o, "writer-wait-ms", json_integer((json_int_t)(st.cbw_wait_ns / 1000000)));
        JobCtx *c = qk_control_job_ctx(job);
        if (c) {
            json_object_set_new(o, "export", json_string(c->export_name));
            json_object_set_new(o, "target-cache", json_string(c->target_cache));
            if (c->view_export) {
                json_object_set_new(o, "view-export", json_string(c->view_export));
            }
        }
    }
    if (qk_job_is_mirror(job)) {
        QkMirrorStats st;
        qk_mirror_get_stats(job, &st);
        json_object_set_new(o, "granularity", json_integer((json_int_t)st.granularity));
        json_object_set_new(o, "chunks", json_integer((json_int_t)st.chunks_submitted));
        json_object_set_new(o, "cursor-restarts", json_integer((json_int_t)st.cursor_restarts));
        json_object_set_new(o, "active-writes", json_integer((json_int_t)st.active_writes));
        if (st.bulk_done_ns) {
            json_object_set_new(o, "ms-bulk", json_integer((st.bulk_done_ns - job->start_ns) / 1000000));
        }
        json_object_set_new(o, "writer-wait-ms", json_integer(st.writer_wait_ns / 1000000));
        JobCtx *c = qk_control_job_ctx(job);
        if (c) {
            json_object_set_new(o, "export", json_string(c->export_name));
            json_object_set_new(o, "switched", json_boolean(c->switched));
            json_object_set_new(o, "target-cache", json_string(c->target_cache));
        }
    }
    return o;
}

static json_t *coroutine_fn cmd_query_jobs(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    (void)args;
    json_t *list = json_array();
    if (!list) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    for (QkJob *j = qk_job_first(); j; j = j->next) {
        json_array_append_new(list, job_json(j));
    }
    return list;
}

static json_t *coroutine_fn cmd_job_complete(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    bool do_switch = false, wait = false;
    QkJob *job = find_job(args, err);
    if (!job || qk_control_arg_bool(args, "switch", &do_switch, err) < 0 ||
        qk_control_arg_bool(args, "wait", &wait, err) < 0) {
        return NULL;
    }
    if ((qk_job_is_mirror(job) ? qk_mirror_complete(job, do_switch, err) : qk_job_complete(job, err)) < 0) {
        return NULL;
    }
    if (wait) {
        qk_co_job_wait(job);
        return job_json(job);
    }
    return json_object();
}

static json_t *coroutine_fn cmd_job_cancel(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    bool wait = false;
    QkJob *job = find_job(args, err);
    if (!job || qk_control_arg_bool(args, "wait", &wait, err) < 0 || qk_job_cancel(job, err) < 0) {
        return NULL;
    }
    if (wait) {
        qk_co_job_wait(job);
    }
    return json_object();
}

static json_t *coroutine_fn cmd_job_set_speed(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    uint64_t speed = 0;
    QkJob *job = find_job(args, err);
    if (!job) {
        return NULL;
    }
    if (!json_object_get(args, "speed")) {
        qk_error_set(err, -EINVAL, "Parameter 'speed' is missing");
        return NULL;
    }
    if (qk_control_arg_size(args, "speed", &speed, err) < 0) {
        return NULL;
    }
    qk_job_set_speed(job, speed);
    return json_object();
}

static json_t *coroutine_fn cmd_job_pause(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    QkJob *job = find_job(args, err);
    return job && qk_job_pause(job, err) == 0 ? json_object() : NULL;
}

static json_t *coroutine_fn cmd_job_resume(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    QkJob *job = find_job(args, err);
    return job && qk_job_resume(job, err) == 0 ? json_object() : NULL;
}

static void dismiss(QkJob *job)
{
    JobCtx *c = qk_control_job_ctx(job);
    if (c) {
        qk_control_job_ctx_free(c);
    }
    qk_job_free(job);
}

static json_t *coroutine_fn cmd_job_dismiss(QkDaemon *d, json_t *args, QkError *err)
{
    (void)d;
    QkJob *job = find_job(args, err);
    if (!job) {
        return NULL;
    }
    if (!qk_job_is_finished(job)) {
        qk_error_set(err, -EBUSY, "Job '%s' is still %s", job->id, qk_job_state_name(job->state));
        return NULL;
    }
    if (job->waiters) {
        /* Another command's wait=true is about to report on it. */
        qk_error_set(err, -EBUSY, "Job '%s' is still being waited for", job->id);
        return NULL;
    }
    dismiss(job);
    return json_object();
}

void qk_control_jobs_cancel_all(void)
{
    for (QkJob *j = qk_job_first(); j; j = j->next) {
        if (!qk_job_is_finished(j)) {
            qk_job_cancel(j, NULL);
        }
    }
}

void coroutine_fn qk_co_control_jobs_shutdown(void)
{
    qk_control_jobs_cancel_all();
    while (qk_job_first()) {
        QkJob *j = qk_job_first();
        qk_co_job_wait_to_free(j);
        dismiss(j);
    }
}

static const char *const start_params[] = {
    "export", "target", "format", "id", "mode", "speed", "granularity", "buf-size",
    "max-in-flight", "ready-threshold", "rescan-per-chunk", "chase-writes", "copy-priority", "target-cache", NULL,
};
static const char *const id_params[] = {"id", NULL};
static const char *const complete_params[] = {"id", "switch", "wait", NULL};
static const char *const cancel_params[] = {"id", "wait", NULL};
static const char *const speed_params[] = {"id", "speed", NULL};

static const QkControlCommand cmds[] = {
    {"query-jobs", cmd_query_jobs, NULL},
    {"mirror-start", cmd_mirror_start, start_params},
    {"job-complete", cmd_job_complete, complete_params},
    {"job-cancel", cmd_job_cancel, cancel_params},
    {"job-set-speed", cmd_job_set_speed, speed_params},
    {"job-pause", cmd_job_pause, id_params},
    {"job-resume", cmd_job_resume, id_params},
    {"job-dismiss", cmd_job_dismiss, id_params},
};

const QkControlTable qk_control_job_table = {cmds, sizeof(cmds) / sizeof(cmds[0])};
