/*
 * Helpers shared by subcommands: error messages and argument parsing in
 * one consistent voice.
 */
#include "cmd.h"
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *qk_progname = "qcowkit";

void qk_tool_error(const char *fmt, ...)
{
    va_list ap;
    /* Keep stdout and stderr in order when both go to one file (tests). */
    fflush(stdout);
    fprintf(stderr, "%s: ", qk_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void qk_tool_size_error(const char *what)
{
    /* qemu-img's words, on two lines. */
    qk_tool_error("Invalid %s specified. You may use k, M, G, T, P or E suffixes for", what);
    qk_tool_error("kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.");
}

int qk_tool_size(const char *arg, uint64_t *out)
{
    int r = qk_parse_size(arg, out);
    const char *p = arg;
    while (r == 0 && isspace((unsigned char)*p)) {
        p++;
    }
    if (r == 0 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        p += 2;
        while (isxdigit((unsigned char)*p)) {
            p++;
        }
        if (*p) {
            qk_tool_error("warning: Using a multiplier suffix on hex numbers is deprecated: %s", arg);
        }
    }
    return r;
}

int qk_tool_cvtnum(const char *what, const char *arg, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    int r = qk_tool_size(arg, &v);
    if (r < 0 && r != -ERANGE) {
        qk_tool_size_error(what);
        return -1;
    }
    if (r == -ERANGE || v < min || v > max) {
        qk_tool_error("Invalid %s specified. Must be between %" PRIu64 " and %" PRIu64 ".", what, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int qk_tool_parse_size(const char *arg, const char *what, uint64_t *out)
{
    if (qk_tool_size(arg, out) < 0) {
        qk_tool_error("Invalid %s specified: '%s'", what, arg);
        return -1;
    }
    return 0;
}

int qk_tool_bad_usage(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "%s: ", qk_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry '%s help %s' for more information\n", qk_progname, cmd);
    return 1;
}

int qk_tool_parse_output(const char *cmd, const char *arg, bool *json)
{
    if (strcmp(arg, "json") == 0) {
        *json = true;
    } else if (strcmp(arg, "human") == 0) {
        *json = false;
    } else {
        qk_tool_error("--output must be used with human or json as argument.");
        (void)cmd;
        return -1;
    }
    return 0;
}

void qk_tool_print_json(json_t *j)
{
    /* Four-space indent and insertion order: the layout qemu-img prints. */
    char *s = json_dumps(j, JSON_INDENT(4) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
    if (!s) {
        return;
    }
    /* qemu-img prints an empty array as "[", a new line and "]" at the
     * line's indent; jansson as "[]". Outside strings only. */
    bool in_str = false;
    size_t line = 0;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\' && s[i + 1]) {
                putchar(c);
                c = s[++i];
            } else if (c == '"') {
                in_str = false;
            }
        } else if (c == '"') {
            in_str = true;
        } else if (c == '\n') {
            line = i + 1;
        } else if (c == '[' && s[i + 1] == ']') {
            size_t indent = strspn(s + line, " ");
            printf("[\n%*s]", (int)indent, "");
            i++;
            continue;
        }
        putchar(c);
    }
    putchar('\n');
    free(s);
}

void qk_tool_warn_guessed_raw(QkBlock *bs, int flags)
{
    if (!bs || !(flags & QK_OPEN_RDWR) || !qk_block_format_probed(bs) ||
        strcmp(qk_block_format_name(bs), "raw") != 0) {
        return;
    }
    fflush(stdout);
    fprintf(stderr,
            "WARNING: Image format was not specified for '%s' and probing guessed raw.\n"
            "         Automatically detecting the format is dangerous for raw images, "
            "write operations on block 0 will be restricted.\n"
            "         Specify the 'raw' format explicitly to remove the restrictions.\n",
            qk_block_filename(bs));
}

QkBlock *qk_tool_open(const char *filename, const char *fmt, int flags, QkError *err)
{
    QkOpenOptions o = {.flags = flags, .format = fmt};
    QkBlock *bs = qk_block_open(filename, &o, err);
    qk_tool_warn_guessed_raw(bs, flags);
    return bs;
}

int qk_tool_close_written(QkBlock *bs, int status, bool quiet, const char *done)
{
    int r = bs ? qk_block_close(bs) : 0;
    if (status == 0 && r < 0) {
        qk_tool_error("Could not write the image: %s", strerror(-r));
        status = 1;
    }
    if (status == 0 && !quiet) {
        printf("%s\n", done);
    }
    return status;
}

/* An encrypted image's "encrypt:" block, in qemu-img's order. */
static void print_encrypt(const QkEncryptInfo *e)
{
    if (!e) {
        return;
    }
    printf("    encrypt:\n");
    if (strcmp(e->format, "luks") != 0) {
        printf("        format: %s\n", e->format);
        return;
    }
    printf("        ivgen alg: %s\n", e->ivgen_alg);
    printf("        hash alg: %s\n", e->hash_alg);
    printf("        cipher alg: %s\n", e->cipher_alg);
    printf("        uuid: %s\n", e->uuid);
    if (e->ivgen_hash_alg[0]) {
        printf("        ivgen hash alg: %s\n", e->ivgen_hash_alg);
    }
    printf("        format: luks\n");
    printf("        cipher mode: %s\n", e->cipher_mode);
    printf("        slots:\n");
    for (int i = 0; i < 8; i++) {
        const QkEncryptSlotInfo *sl = &e->slots[i];
        printf("            [%d]:\n                active: %s\n", i, sl->active ? "true" : "false");
        if (sl->active) {
            printf("                iters: %" PRIu32 "\n", sl->iters);
        }
        printf("                key offset: %" PRIu64 "\n", sl->key_offset);
        if (sl->active) {
            printf("                stripes: %" PRIu32 "\n", sl->stripes);
        }
    }
    printf("        payload offset: %" PRIu64 "\n", e->payload_offset);
    printf("        master key iters: %" PRIu32 "\n", e->master_key_iters);
}

json_t *qk_tool_encrypt_json(const QkEncryptInfo *e)
{
    json_t *o = json_object();
    if (strcmp(e->format, "luks") != 0) {
        json_object_set_new(o, "format", json_string(e->format));
        return o;
    }
    json_object_set_new(o, "ivgen-alg", json_string(e->ivgen_alg));
    json_object_set_new(o, "hash-alg", json_string(e->hash_alg));
    json_object_set_new(o, "cipher-alg", json_string(e->cipher_alg));
    json_object_set_new(o, "uuid", json_string(e->uuid));
    if (e->ivgen_hash_alg[0]) {
        json_object_set_new(o, "ivgen-hash-alg", json_string(e->ivgen_hash_alg));
    }
    json_object_set_new(o, "format", json_string("luks"));
    json_object_set_new(o, "cipher-mode", json_string(e->cipher_mode));
    json_t *sl = json_array();
    for (int i = 0; i < 8; i++) {
        const QkEncryptSlotInfo *k = &e->slots[i];
        json_t *so = json_object();
        json_object_set_new(so, "active", json_boolean(k->active));
        if (k->active) {
            json_object_set_new(so, "iters", json_integer(k->iters));
        }
        json_object_set_new(so, "key-offset", json_integer((json_int_t)k->key_offset));
        if (k->active) {
            json_object_set_new(so, "stripes", json_integer(k->stripes));
        }
        json_array_append_new(sl, so);
    }
    json_object_set_new(o, "slots", sl);
    json_object_set_new(o, "payload-offset", json_integer((json_int_t)e->payload_offset));
    json_object_set_new(o, "master-key-iters", json_integer(e->master_key_iters));
    return o;
}

void qk_tool_print_format_specific(const QkImageInfo *info)
{
    if (info->qcow2_version == 0) {
        return;
    }
    printf("Format specific information:\n");
    printf("    compat: %s\n", info->qcow2_version >= 3 ? "1.1" : "0.10");
    printf("    compression type: %s\n", info->compression_type ? info->compression_type : "zlib");
    if (info->qcow2_version >= 3) {
        printf("    lazy refcounts: %s\n", info->lazy_refcounts ? "true" : "false");
    }
    if (info->nb_bitmaps) {
        printf("    bitmaps:\n");
        for (int i = 0; i < info->nb_bitmaps; i++) {
            const QkBitmapInfo *b = &info->bitmaps[i];
            int f = 0;
            printf("        [%d]:\n            flags:\n", i);
            if (b->in_use) {
                printf("                [%d]: in-use\n", f++);
            }
            if (b->auto_enabled) {
                printf("                [%d]: auto\n", f++);
            }
            printf("            name: %s\n            granularity: %" PRIu64 "\n", b->name, b->granularity);
        }
    }
    printf("    refcount bits: %u\n", info->refcount_bits);
    /* qemu-img's order puts the encryption between the data file's two. */
    if (info->data_file) {
        printf("    data file: %s\n", info->data_file);
    }
    print_encrypt(info->encrypt);
    if (info->data_file) {
        printf("    data file raw: %s\n", info->data_file_raw ? "true" : "false");
    }
    if (info->qcow2_version >= 3) {
        printf("    corrupt: %s\n", info->corrupt ? "true" : "false");
        printf("    extended l2: %s\n", info->extended_l2 ? "true" : "false");
    }
}


bool qk_tool_same_file(const char *a, const char *b)
{
    if (qk_block_is_remote(a) || qk_block_is_remote(b)) {
        return strcmp(a, b) == 0; /* no host file to compare */
    }
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int qk_tool_usage_error(const char *fmt, const char *arg)
{
    fflush(stdout);
    fprintf(stderr, "%s: ", qk_progname);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry '%s --help' for more information\n", qk_progname);
    return 1;
}

int qk_tool_parse_bool(const char *prefix, const char *name, const char *v, bool *out)
{
    if (strcmp(v, "on") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "true") == 0) {
        *out = true;
    } else if (strcmp(v, "off") == 0 || strcmp(v, "no") == 0 || strcmp(v, "false") == 0) {
        *out = false;
    } else {
        qk_tool_error("%sParameter '%s' expects 'on' or 'off'", prefix, name);
        return -1;
    }
    return 0;
}

/* -l of convert and measure: "snapshot.id=ID", "snapshot.name=NAME" or
 * both, comma separated; anything else is an id or a name (the id is
 * tried first, as qemu-img does). */
bool qk_tool_parse_snapshot(const char *arg, QkToolSnapshot *p)
{
    memset(p, 0, sizeof(*p));
    snprintf(p->buf, sizeof(p->buf), "%s", arg);
    if (strncmp(arg, "snapshot.", 9) != 0) {
        p->id = p->buf;
        p->id_or_name = true;
        return true;
    }
    for (char *save = NULL, *kv = strtok_r(p->buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq) {
            *eq = '\0';
        } else {
            fprintf(stderr, "%s: warning: short-form boolean option '%s' deprecated\nPlease use %s=on instead\n",
                    qk_progname, kv, kv);
        }
        char *v = eq ? eq + 1 : "on";
        if (strcmp(kv, "snapshot.id") == 0) {
            p->id = v;
        } else if (strcmp(kv, "snapshot.name") == 0) {
            p->name = v;
        } else {
            qk_tool_error("Invalid parameter '%s'", kv);
            qk_tool_error("Failed in parsing snapshot param '%s'", arg);
            return false;
        }
    }
    return true;
}

typedef struct LoadSnap {
    QkBlock *bs;
    const QkToolSnapshot *p;
    QkError err;
    int ret;
} LoadSnap;

static void coroutine_fn load_snap_co(void *opaque)
{
    LoadSnap *l = opaque;
    l->ret = qk_co_snapshot_load_tmp(l->bs, l->p->id, l->p->name, &l->err);
    if (l->ret == -ENOENT && l->p->id_or_name) {
        l->err = (QkError){0};
        l->ret = qk_co_snapshot_load_tmp(l->bs, NULL, l->p->id, &l->err);
    }
}

int qk_tool_load_snapshot(QkBlock *bs, const QkToolSnapshot *p)
{
    LoadSnap l = {.bs = bs, .p = p};
    qk_co_run(load_snap_co, &l);
    if (l.ret < 0) {
        qk_tool_error("Failed to load snapshot: %s", l.err.msg);
        return -1;
    }
    return 0;
}
