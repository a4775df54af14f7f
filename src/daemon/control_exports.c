/*
 * Control commands for exports: query-exports, export-add, export-del.
 *
 * Owns: the JSON shape of an export. Must not know the socket framing.
 */
#include "daemon/control.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static json_t *coroutine_fn cmd_query_exports(QkDaemon *d, json_t *args, QkError *err)
{
    (void)args;
    json_t *list = json_array();
    if (!list) {
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    for (QkNbdExport *e = qk_nbd_server_first_export(qk_daemon_nbd_server(d)); e; e = e->next) {
        json_t *o = json_pack("{s:s,s:s,s:s,s:b,s:I,s:s,s:i}",
                              "name", e->name,
                              "file", e->bs->filename,
                              "format", e->bs->drv->format_name,
                              "readonly", e->readonly,
                              "size", (json_int_t)qk_block_length(e->bs),
                              "cache", e->cache,
                              "clients", (int)e->clients);
        if (o && e->description) {
            json_object_set_new(o, "description", json_string(e->description));
        }
        json_array_append_new(list, o);
    }
    return list;
}

static json_t *coroutine_fn cmd_export_add(QkDaemon *d, json_t *args, QkError *err)
{
    const char *name, *file, *format, *cache, *desc;
    QkExportSpec spec = {0};
    if (qk_control_arg_string(args, "name", true, &name, err) < 0 ||
        qk_control_arg_string(args, "file", true, &file, err) < 0 ||
        qk_control_arg_string(args, "format", false, &format, err) < 0 ||
        qk_control_arg_string(args, "cache", false, &cache, err) < 0 ||
        qk_control_arg_string(args, "description", false, &desc, err) < 0 ||
        qk_control_arg_bool(args, "readonly", &spec.readonly, err) < 0 ||
        qk_control_arg_size(args, "cache-size", &spec.cache_size, err) < 0) {
        return NULL;
    }
    /* The spec only borrows these strings for the call. */
    spec.name = (char *)name;
    spec.file = (char *)file;
    spec.format = (char *)format;
    spec.cache = (char *)cache;
    spec.description = (char *)desc;
    if (qk_co_daemon_add_export(d, &spec, err) < 0) {
        return NULL;
    }
    return json_object();
}

static json_t *coroutine_fn cmd_export_del(QkDaemon *d, json_t *args, QkError *err)
{
    const char *name;
    if (qk_control_arg_string(args, "name", true, &name, err) < 0) {
        return NULL;
    }
    const char *job = qk_control_export_job(name);
    if (job) {
        /* Closing the node would leave the job reading a freed node. */
        qk_error_set(err, -EBUSY, "Export '%s' is in use by job '%s'", name, job);
        return NULL;
    }
    /* name points into args, which the dispatcher keeps alive across the yield. */
    if (qk_co_nbd_server_del_export(qk_daemon_nbd_server(d), name, err) < 0) {
        return NULL;
    }
    return json_object();
}

static const char *const add_params[] = {"name",        "file",       "format", "readonly", "cache",
                                         "description", "cache-size", NULL};
static const char *const del_params[] = {"name", NULL};

static const QkControlCommand cmds[] = {
    {"query-exports", cmd_query_exports, NULL},
    {"export-add", cmd_export_add, add_params},
    {"export-del", cmd_export_del, del_params},
};

const QkControlTable qk_control_export_table = {cmds, sizeof(cmds) / sizeof(cmds[0])};
