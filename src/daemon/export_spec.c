/*
 * Parsing of export specs ("name=disk0,file=a.qcow2,readonly"). A comma
 * inside a value is written ",," as qemu's option syntax does.
 *
 * Owns: the spec syntax. Must not open anything.
 */
#include "daemon/daemon.h"
#include "util/size.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void qk_export_spec_clear(QkExportSpec *s)
{
    free(s->name);
    free(s->file);
    free(s->format);
    free(s->cache);
    free(s->description);
    memset(s, 0, sizeof(*s));
}

static int parse_bool(const char *v, bool *out)
{
    if (!v || !strcmp(v, "on") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "1")) {
        *out = true;
    } else if (!strcmp(v, "off") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "0")) {
        *out = false;
    } else {
        return -EINVAL;
    }
    return 0;
}

/* Copies the next item up to an unescaped comma; returns where to go on. */
static const char *next_item(const char *p, char *out)
{
    size_t n = 0;
    while (*p) {
        if (*p == ',') {
            if (p[1] != ',') {
                break;
            }
            p++;
        }
        out[n++] = *p++;
    }
    out[n] = 0;
    return *p == ',' ? p + 1 : p;
}

int qk_export_spec_parse(const char *text, QkExportSpec *out, QkError *err)
{
    memset(out, 0, sizeof(*out));
    char *item = malloc(strlen(text) + 1);
    if (!item) {
        return qk_error_set(err, -ENOMEM, "out of memory");
    }
    int r = 0;
    const char *p = text;
    while (*p && r == 0) {
        p = next_item(p, item);
        if (!item[0]) {
            continue;
        }
        char *eq = strchr(item, '=');
        const char *val = eq ? eq + 1 : NULL;
        if (eq) {
            *eq = 0;
        }
        char **slot = NULL;
        if (!strcmp(item, "name")) {
            slot = &out->name;
        } else if (!strcmp(item, "file")) {
            slot = &out->file;
        } else if (!strcmp(item, "format")) {
            slot = &out->format;
        } else if (!strcmp(item, "cache")) {
            slot = &out->cache;
        } else if (!strcmp(item, "description")) {
            slot = &out->description;
        } else if (!strcmp(item, "cache-size")) {
            if (!val || qk_parse_size(val, &out->cache_size) < 0 || out->cache_size == 0) {
                r = qk_error_set(err, -EINVAL, "cache-size expects a size, not '%s'", val ? val : "");
            }
            continue;
        } else if (!strcmp(item, "readonly")) {
            if (parse_bool(val, &out->readonly) < 0) {
                r = qk_error_set(err, -EINVAL, "readonly expects on or off, not '%s'", val);
            }
            continue;
        } else {
            r = qk_error_set(err, -EINVAL, "unknown export option '%s'", item);
            continue;
        }
        if (!val || !val[0]) {
            r = qk_error_set(err, -EINVAL, "export option '%s' needs a value", item);
            continue;
        }
        free(*slot);
        *slot = strdup(val);
        if (!*slot) {
            r = qk_error_set(err, -ENOMEM, "out of memory");
        }
    }
    free(item);
    if (r == 0 && (!out->name || !out->file)) {
        r = qk_error_set(err, -EINVAL, "an export needs name= and file=");
    }
    if (r < 0) {
        qk_export_spec_clear(out);
    }
    return r;
}
