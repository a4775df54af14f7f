/*
 * Control commands for backups of a live export: backup-start (push: the
 * job writes the point in time to a target) and backup-export-start
 * (pull: the point in time is exported over NBD for a backup client to
 * read, "fleecing"). Both end with job-complete or job-cancel like any job;
 * query-jobs shows them.
 *
 * Owns: their arguments and the temporary image of a point-in-time
 * export. Must not know how the job copies (jobs/backup.c).
 */
#include "daemon/control_jobs_int.h"
#include "block/dirty_bitmap.h"
#include "jobs/backup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Parses bitmap and bitmap-mode into o. */
static int bitmap_args(json_t *args, QkBackupOptions *o, QkError *err)
{
    const char *bmode;
    if (qk_control_arg_string(args, "bitmap", false, &o->bitmap, err) < 0 ||
        qk_control_arg_string(args, "bitmap-mode", false, &bmode, err) < 0) {
        return err->code;
    }
    if (bmode && qk_backup_bitmap_mode_parse(bmode, &o->bitmap_mode) < 0) {
        return qk_error_set(err, -EINVAL, "Parameter 'bitmap-mode' expects 'on-success', 'never' or 'always'");
    }
    if (bmode && !o->bitmap) {
        return qk_error_set(err, -EINVAL, "Cannot specify bitmap sync mode without a bitmap");
    }
    return 0;
}

/* A push backup of an export to a target file: the image as it was at the
 * start, whatever the export's clients write meanwhile. A target that does
 * not exist is created (qcow2 unless format says otherwise, over backing
 * when given: the previous backup of an incremental chain). */
static json_t *coroutine_fn cmd_backup_start(QkDaemon *d, json_t *args, QkError *err)
{
    const char *exp_name, *target, *format, *id, *sync, *backing, *bfmt, *tcache;
    QkBackupOptions o = {0};
    if (qk_control_arg_string(args, "export", true, &exp_name, err) < 0 ||
        qk_control_arg_string(args, "target", true, &target, err) < 0 ||
        qk_control_arg_string(args, "sync", true, &sync, err) < 0 ||
        qk_control_arg_string(args, "format", false, &format, err) < 0 ||
        qk_control_arg_string(args, "id", false, &id, err) < 0 ||
        qk_control_arg_string(args, "backing", false, &backing, err) < 0 ||
        qk_control_arg_string(args, "backing-format", false, &bfmt, err) < 0 ||
        qk_control_arg_string(args, "target-cache", false, &tcache, err) < 0 ||
        qk_control_arg_size(args, "speed", &o.speed, err) < 0 ||
        qk_control_arg_size(args, "granularity", &o.granularity, err) < 0 || bitmap_args(args, &o, err) < 0) {
        return NULL;
    }
    if (qk_backup_sync_parse(sync, &o.sync) < 0) {
        qk_error_set(err, -EINVAL, "Parameter 'sync' expects 'full', 'incremental', 'bitmap' or 'none'");
        return NULL;
    }
    QkNbdExport *e = qk_control_job_check_args(d, exp_name, id, tcache, target, err);
    if (!e) {
        return NULL;
    }
    if (o.bitmap && !qk_dirty_bitmap_find(e->bs, o.bitmap)) {
        qk_error_set(err, -ENOENT, "Dirty bitmap '%s' not found", o.bitmap);
        return NULL;
    }
    struct stat sb;
    if (qk_block_is_remote(target) || stat(target, &sb) == 0) {
        if (backing) {
            qk_error_set(err, -EEXIST, "Target '%s' exists: 'backing' is only for a target the job creates", target);
            return NULL;
        }
    } else {
        QkCreateOptions co = {.format = format ? format : "qcow2",
                              .size = (uint64_t)qk_block_length(e->bs), .size_set = true,
                              .backing_file = backing, .backing_fmt = backing ? (bfmt ? bfmt : "qcow2") : NULL};
        if (qk_co_block_create(target, &co, err) < 0) {
            qk_error_prefix(err, "Could not create '%s'", target);
            return NULL;
        }
        o.target_is_zero = !backing;
    }
    JobCtx *c = qk_control_job_open_target(d, exp_name, target, format, tcache, err);
    if (!c) {
        return NULL;
    }
    return qk_control_job_attach(c, qk_backup_start(id, c->source, c->target, &o, err));
}

/* A point-in-time export of a live export: a sync=none backup job into a
 * temporary qcow2 image (file, or a new file under $TMPDIR or /var/tmp,
 * unlinked once open)
 * that holds the old contents of what the guest overwrites, and a
 * read-only export `name` of the job's view, with the bitmap as of the
 * start as its qemu:dirty-bitmap context. job-complete ends it (the bitmap
 * keeps only what was written since the start), job-cancel too (the bitmap
 * gets back what it had: the backup did not happen); either removes the
 * export and the temporary image. */
static json_t *coroutine_fn cmd_backup_export_start(QkDaemon *d, json_t *args, QkError *err)
{
    const char *exp_name, *name, *file, *id;
    QkBackupOptions o = {.sync = QK_BACKUP_SYNC_NONE};
    if (qk_control_arg_string(args, "export", true, &exp_name, err) < 0 ||
        qk_control_arg_string(args, "name", true, &name, err) < 0 ||
        qk_control_arg_string(args, "file", false, &file, err) < 0 ||
        qk_control_arg_string(args, "id", false, &id, err) < 0 ||
        qk_control_arg_size(args, "granularity", &o.granularity, err) < 0 || bitmap_args(args, &o, err) < 0) {
        return NULL;
    }
    if (qk_nbd_server_find_export(qk_daemon_nbd_server(d), name)) {
        qk_error_set(err, -EEXIST, "Export '%s' already exists", name);
        return NULL;
    }
    QkNbdExport *e = qk_control_job_check_args(d, exp_name, id, NULL, file, err);
    if (!e) {
        return NULL;
    }
    if (o.bitmap && !qk_dirty_bitmap_find(e->bs, o.bitmap)) {
        qk_error_set(err, -ENOENT, "Dirty bitmap '%s' not found", o.bitmap);
        return NULL;
    }
    char *temp = NULL;
    struct stat sb;
    if (file) {
        if (qk_block_is_remote(file) || stat(file, &sb) == 0) {
            qk_error_set(err, -EEXIST, "'%s' exists: the point in time needs a new local file", file);
            return NULL;
        }
        temp = strdup(file);
    } else {
        const char *dir = getenv("TMPDIR");
        if (asprintf(&temp, "%s/qcowkit-view-XXXXXX", dir && *dir ? dir : "/var/tmp") < 0) {
            temp = NULL;
        } else {
            int fd = mkstemp(temp); /* reserves the name; create replaces it */
            if (fd < 0) {
                qk_error_set_errno(err, -errno, "Could not make a temporary file in '%s'",
                                   dir && *dir ? dir : "/var/tmp");
                free(temp);
                return NULL;
            }
            close(fd);
        }
    }
    if (!temp) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    QkCreateOptions co = {.format = "qcow2", .size = (uint64_t)qk_block_length(e->bs), .size_set = true};
    if (qk_co_block_create(temp, &co, err) < 0) {
        qk_error_prefix(err, "Could not create '%s'", temp);
        unlink(temp);
        free(temp);
        return NULL;
    }
    o.target_is_zero = true;
    /* Temporary: nothing in it has to survive a crash. */
    JobCtx *c = qk_control_job_open_target(d, exp_name, temp, "qcow2", "unsafe", err);
    if (!c) {
        unlink(temp);
        free(temp);
        return NULL;
    }
    if (!file) {
        /* A name of our own making, needed only to open it: gone now, the
         * view lives on the open node, and a killed daemon leaves no file. */
        unlink(temp);
    }
    json_t *ret = qk_control_job_attach(c, qk_backup_start(id, c->source, c->target, &o, err));
    if (!ret) {
        unlink(temp);
        free(temp);
        return NULL;
    }
    c->temp_file = temp; /* the job's end removes it */
    QkJob *job = c->job;
    /* Named before the export exists: the job's end removes the export by it. */
    c->view_export = strdup(name);
    QkBlock *view = c->view_export ? qk_backup_snapshot_node(job, name, err) : NULL;
    if (!c->view_export) {
        qk_error_set(err, -ENOMEM, "out of memory");
    }
    char desc[256];
    snprintf(desc, sizeof(desc), "export '%s' as of backup job '%s'", exp_name, job->id);
    if (!view || qk_nbd_server_add_export(qk_daemon_nbd_server(d), name, desc, view, true, "none", err) < 0) {
        qk_co_block_close(view); /* not added: still ours */
        free(c->view_export);
        c->view_export = NULL;
        QkError ignored = {0};
        qk_job_cancel(job, &ignored);
        qk_co_job_wait_to_free(job);
        qk_control_job_ctx_free(c);
        qk_job_free(job);
        json_decref(ret);
        return NULL;
    }
    return ret;
}

static const char *const backup_params[] = {
    "export", "target", "sync", "format", "id", "bitmap", "bitmap-mode", "backing", "backing-format",
    "target-cache", "speed", "granularity", NULL,
};
static const char *const export_params[] = {
    "export", "name", "file", "id", "bitmap", "bitmap-mode", "granularity", NULL,
};

static const QkControlCommand cmds[] = {
    {"backup-start", cmd_backup_start, backup_params},
    {"backup-export-start", cmd_backup_export_start, export_params},
};

const QkControlTable qk_control_backup_table = {cmds, sizeof(cmds) / sizeof(cmds[0])};
