/*
 * Backing file names as images record them, turned into the name to open:
 * a path (relative to the image's directory), a protocol name (nbd://,
 * rbd:), "file:PATH", or a json: description of a local file, which QEMU
 * writes after some block jobs. The last two name paths relative to the
 * current directory, as QEMU reads them. A json: description may also name
 * the backing file's format.
 */
#include "block/block.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Keys of a json: description read as "file.filename"-style dotted names. */
typedef struct Keys {
    const char *driver, *file_driver, *filename, *file_filename;
    char bad[128]; /* the first key we do not understand */
} Keys;

/* Options QEMU accepts that change nothing about what is read. */
static bool harmless(const char *key)
{
    static const char *const ok[] = {"read-only", "auto-read-only", "discard", "detect-zeroes", "locking",
                                     "aio", "aio-max-batch", "cache.direct", "cache.no-flush", "node-name"};
    const char *last = strncmp(key, "file.", 5) == 0 ? key + 5 : key;
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        if (strcmp(last, ok[i]) == 0) {
            return true;
        }
    }
    return false;
}

static void note_bad(Keys *k, const char *key)
{
    if (!k->bad[0]) {
        snprintf(k->bad, sizeof(k->bad), "%s", key);
    }
}

static void collect(json_t *obj, const char *prefix, Keys *k, int depth)
{
    const char *name;
    json_t *v;
    json_object_foreach(obj, name, v) {
        char key[128];
        if ((size_t)snprintf(key, sizeof(key), "%s%s", prefix, name) >= sizeof(key) || depth > 2) {
            note_bad(k, name);
            continue;
        }
        if (json_is_object(v)) {
            char sub[130];
            snprintf(sub, sizeof(sub), "%s.", key);
            collect(v, sub, k, depth + 1);
            continue;
        }
        const char **slot = strcmp(key, "driver") == 0        ? &k->driver
                            : strcmp(key, "file.driver") == 0   ? &k->file_driver
                            : strcmp(key, "filename") == 0      ? &k->filename
                            : strcmp(key, "file.filename") == 0 ? &k->file_filename
                                                                : NULL;
        if (slot && json_is_string(v)) {
            *slot = json_string_value(v);
        } else if (slot || !harmless(key)) {
            note_bad(k, key);
        }
    }
}

static bool is_format(const char *d)
{
    return strcmp(d, "qcow2") == 0 || strcmp(d, "raw") == 0;
}

/* A json: name of a local file (a format over the file protocol, or the
 * file protocol alone); anything else is refused with its reason. */
static int resolve_json(const char *backing, char **path, char **format, QkError *err)
{
    json_error_t jerr;
    json_t *root = json_loads(backing + 5, JSON_REJECT_DUPLICATES, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return qk_error_set(err, -EINVAL, "Could not parse the backing file name '%s': %s", backing,
                            root ? "not a JSON object" : jerr.text);
    }
    Keys k = {0};
    collect(root, "", &k, 0);
    const char *file = NULL, *fmt = NULL, *why = NULL;
    bool name_key = false;
    if (k.driver && !is_format(k.driver) && strcmp(k.driver, "file") != 0) {
        why = "only the file protocol and the qcow2 and raw formats are supported";
    } else if (k.bad[0]) {
        why = "it has an option qcowkit does not support";
        name_key = true;
    } else if (!k.driver || strcmp(k.driver, "file") == 0) {
        /* The protocol alone, or options for it: the format is probed. */
        file = k.filename ? k.filename : k.file_filename;
        if ((k.filename && k.file_filename) || (k.file_driver && strcmp(k.file_driver, "file") != 0) ||
            (k.driver && k.file_filename)) {
            why = "it does not describe one local file";
        }
    } else if (is_format(k.driver)) {
        fmt = k.driver;
        file = k.file_filename;
        if (k.filename || (k.file_driver && strcmp(k.file_driver, "file") != 0)) {
            why = "only local files are supported under a format";
        }
    }
    if (!why && (!file || !*file)) {
        why = "it names no file";
    }
    int r = 0;
    if (why) {
        r = qk_error_set(err, -ENOTSUP, "Unsupported backing file name '%s': %s%s%s%s", backing, why,
                         name_key ? " ('" : "", name_key ? k.bad : "", name_key ? "')" : "");
    } else {
        *path = strdup(file);
        if (format && fmt) {
            *format = strdup(fmt);
        }
        if (!*path || (format && fmt && !*format)) {
            r = qk_error_set(err, -ENOMEM, "out of memory");
        }
    }
    json_decref(root);
    return r;
}

int qk_block_backing_resolve(const char *image, const char *backing, char **path, char **format, QkError *err)
{
    *path = NULL;
    if (format) {
        *format = NULL;
    }
    int r = 0;
    if (strncmp(backing, "json:", 5) == 0) {
        r = resolve_json(backing, path, format, err);
    } else if (strncmp(backing, "file:", 5) == 0) {
        *path = strdup(backing + 5);
    } else if (backing[0] == '/' || strstr(backing, "://") || strncmp(backing, "nbd:", 4) == 0 ||
               qk_block_is_rbd_name(backing)) {
        *path = strdup(backing);
    } else {
        const char *slash = strrchr(image, '/');
        size_t dlen = slash ? (size_t)(slash - image) + 1 : 0;
        *path = malloc(dlen + strlen(backing) + 1);
        if (*path) {
            memcpy(*path, image, dlen);
            strcpy(*path + dlen, backing);
        }
    }
    if (r == 0 && !*path) {
        r = qk_error_set(err, -ENOMEM, "out of memory");
    }
    if (r < 0) {
        free(*path);
        *path = NULL;
        if (format) {
            free(*format);
            *format = NULL;
        }
    }
    return r;
}

char *qk_block_backing_path(const char *image, const char *backing)
{
    char *path;
    QkError err = {0};
    int r = qk_block_backing_resolve(image, backing, &path, NULL, &err);
    if (r < 0 && r != -ENOMEM) {
        /* Opening it fails with resolve's reason; shown as recorded here. */
        path = strdup(backing);
    }
    qk_error_clear(&err);
    return path;
}
