/*
 * --image-opts and --target-image-opts: images named by QEMU-style key
 * lists (driver=qcow2,file.filename=a.qcow2 or driver=rbd,pool=p,image=i)
 * instead of file names. Before a command parses its arguments, each key
 * list is replaced by the name qcowkit takes (a path, an rbd: or nbd:
 * name) and its format goes in as the command's -f, -F or -O, so every
 * command keeps one way of opening images.
 *
 * Keys understood: driver (qcow2, raw, file, rbd, nbd) at the top level,
 * and the protocol's keys either at the top level (driver=rbd,...) or
 * under file. (driver=qcow2,file.driver=rbd,...): file: filename; rbd:
 * pool, namespace, image, snapshot, conf, user; nbd: server.type,
 * server.path, server.host, server.port, export. Anything else is refused
 * by name rather than ignored.
 */
#include "cmd.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 32

typedef struct KeyList {
    char *key[MAX_KEYS];
    char *val[MAX_KEYS];
    bool used[MAX_KEYS];
    int n;
} KeyList;

/* The format flags each command takes, for its first and second image
 * key list; convert's target gets -O. */
static const struct {
    const char *cmd;
    const char *flag1, *flag2;
} commands[] = {
    {"info", "-f", NULL},     {"check", "-f", NULL},    {"map", "-f", NULL},
    {"measure", "-f", NULL},  {"resize", "-f", NULL},   {"bench", "-f", NULL},
    {"snapshot", "-f", NULL}, {"amend", "-f", NULL},    {"commit", "-f", NULL},
    {"rebase", "-f", NULL},   {"bitmap", "-f", NULL},   {"compare", "-f", "-F"},
    {"convert", "-f", NULL},
};

static void keys_free(KeyList *k)
{
    for (int i = 0; i < k->n; i++) {
        free(k->key[i]);
        free(k->val[i]);
    }
    k->n = 0;
}

/* Splits "a=1,b=x,,y" (",," is a comma inside a value). */
static int keys_parse(const char *s, KeyList *k)
{
    memset(k, 0, sizeof(*k));
    while (*s) {
        const char *eq = strchr(s, '=');
        const char *comma = strchr(s, ',');
        if (!eq || (comma && comma < eq)) {
            size_t len = comma ? (size_t)(comma - s) : strlen(s);
            qk_tool_error("Invalid image options: '%.*s' has no value (KEY=VALUE)", (int)len, s);
            return -1;
        }
        if (k->n == MAX_KEYS) {
            qk_tool_error("Invalid image options: more than %d keys", MAX_KEYS);
            return -1;
        }
        char *key = strndup(s, (size_t)(eq - s));
        char *val = malloc(strlen(eq));
        if (!key || !val) {
            free(key);
            free(val);
            qk_tool_error("out of memory");
            return -1;
        }
        const char *p = eq + 1;
        char *o = val;
        while (*p && !(*p == ',' && p[1] != ',')) {
            if (*p == ',') {
                p++; /* ",," */
            }
            *o++ = *p++;
        }
        *o = '\0';
        for (int i = 0; i < k->n; i++) {
            if (strcmp(k->key[i], key) == 0) {
                qk_tool_error("Invalid image options: '%s' given twice", key);
                free(key);
                free(val);
                return -1;
            }
        }
        k->key[k->n] = key;
        k->val[k->n] = val;
        k->n++;
        s = *p ? p + 1 : p;
    }
    return 0;
}

/* The value of PREFIX+NAME, marked as used; NULL when absent. */
static const char *get(KeyList *k, const char *prefix, const char *name)
{
    size_t pl = strlen(prefix);
    for (int i = 0; i < k->n; i++) {
        if (strncmp(k->key[i], prefix, pl) == 0 && strcmp(k->key[i] + pl, name) == 0) {
            k->used[i] = true;
            return k->val[i];
        }
    }
    return NULL;
}

/* Appends S to the name (escaping the characters an rbd: name gives
 * meaning to with a backslash when ESCAPE); false when it does not fit. */
static bool put(char *out, size_t size, const char *s, bool escape)
{
    size_t n = strlen(out);
    for (; *s; s++) {
        bool esc = escape && strchr("\\/@:=", *s);
        if (n + 1 + esc >= size) {
            return false;
        }
        if (esc) {
            out[n++] = '\\';
        }
        out[n++] = *s;
    }
    out[n] = '\0';
    return true;
}

/* Builds the name of the protocol node described by the keys under
 * PREFIX ("" or "file."). Returns a malloc'd name, or NULL after an
 * error message. */
static char *protocol_name(KeyList *k, const char *prefix, const char *proto)
{
    char name[4096] = "";
    if (strcmp(proto, "file") == 0) {
        const char *f = get(k, prefix, "filename");
        if (!f || !*f) {
            qk_tool_error("Parameter '%sfilename' is required", prefix);
            return NULL;
        }
        /* A path that would read as a protocol name ("rbd:x") stays a
         * path. */
        static const char *const protos[] = {"rbd:", "nbd:", "nbd+", "nbds:", "nbds+", "json:"};
        bool proto_like = false;
        for (size_t i = 0; i < sizeof(protos) / sizeof(protos[0]); i++) {
            proto_like |= strncmp(f, protos[i], strlen(protos[i])) == 0;
        }
        if (snprintf(name, sizeof(name), "%s%s", proto_like ? "./" : "", f) >= (int)sizeof(name)) {
            qk_tool_error("Parameter '%sfilename' is longer than %zu bytes", prefix, sizeof(name) - 3);
            return NULL;
        }
    } else if (strcmp(proto, "rbd") == 0) {
        const char *pool = get(k, prefix, "pool"), *image = get(k, prefix, "image");
        const char *ns = get(k, prefix, "namespace"), *snap = get(k, prefix, "snapshot");
        const char *conf = get(k, prefix, "conf"), *user = get(k, prefix, "user");
        if (!pool || !*pool || !image || !*image) {
            qk_tool_error("Parameter '%s%s' is required", prefix, !pool || !*pool ? "pool" : "image");
            return NULL;
        }
        size_t z = sizeof(name);
        bool fits = put(name, z, "rbd:", false) && put(name, z, pool, true) && put(name, z, "/", false);
        if (ns && *ns) {
            fits = fits && put(name, z, ns, true) && put(name, z, "/", false);
        }
        fits = fits && put(name, z, image, true);
        if (snap && *snap) {
            fits = fits && put(name, z, "@", false) && put(name, z, snap, true);
        }
        if (conf && *conf) {
            fits = fits && put(name, z, ":conf=", false) && put(name, z, conf, true);
        }
        if (user && *user) {
            fits = fits && put(name, z, ":id=", false) && put(name, z, user, true);
        }
        if (!fits) {
            qk_tool_error("The rbd image options make a name longer than %zu bytes", z - 1);
            return NULL;
        }
    } else if (strcmp(proto, "nbd") == 0) {
        const char *type = get(k, prefix, "server.type"), *exp = get(k, prefix, "export");
        const char *path = get(k, prefix, "server.path"), *host = get(k, prefix, "server.host");
        const char *port = get(k, prefix, "server.port");
        int len;
        if (type && strcmp(type, "unix") == 0 && path) {
            len = snprintf(name, sizeof(name), "nbd+unix:///%s?socket=%s", exp ? exp : "", path);
        } else if (type && strcmp(type, "inet") == 0 && host) {
            len = snprintf(name, sizeof(name), "nbd://%s:%s/%s", host, port ? port : "10809", exp ? exp : "");
        } else {
            qk_tool_error("Parameter '%sserver' needs type=unix with path, or type=inet with host", prefix);
            return NULL;
        }
        if (len >= (int)sizeof(name)) {
            qk_tool_error("The nbd image options make a name longer than %zu bytes", sizeof(name) - 1);
            return NULL;
        }
    } else {
        qk_tool_error("Unknown protocol '%s' in the image options (file, rbd or nbd)", proto);
        return NULL;
    }
    char *r = strdup(name);
    if (!r) {
        qk_tool_error("out of memory");
    }
    return r;
}

/* Turns one key list into a name and a format ("qcow2" or "raw"). */
static char *translate(const char *opts, const char **fmt)
{
    KeyList k;
    if (keys_parse(opts, &k) < 0) {
        keys_free(&k);
        return NULL;
    }
    char *name = NULL;
    const char *driver = get(&k, "", "driver");
    if (!driver) {
        qk_tool_error("Parameter 'driver' is required");
        goto out;
    }
    if (strcmp(driver, "qcow2") == 0 || strcmp(driver, "raw") == 0) {
        *fmt = strcmp(driver, "qcow2") == 0 ? "qcow2" : "raw";
        const char *fd = get(&k, "file.", "driver");
        name = protocol_name(&k, "file.", fd ? fd : "file");
    } else if (strcmp(driver, "file") == 0 || strcmp(driver, "rbd") == 0 || strcmp(driver, "nbd") == 0) {
        *fmt = "raw";
        name = protocol_name(&k, "", driver);
    } else {
        qk_tool_error("Unknown driver '%s' (qcow2, raw, file, rbd or nbd)", driver);
        goto out;
    }
    for (int i = 0; name && i < k.n; i++) {
        if (!k.used[i]) {
            /* QEMU's wording, with the layer the key belongs to. */
            bool is_format = strcmp(driver, "qcow2") == 0 || strcmp(driver, "raw") == 0;
            bool proto = is_format && strncmp(k.key[i], "file.", 5) == 0;
            if (proto || !is_format) {
                const char *fd = get(&k, "file.", "driver");
                qk_tool_error("Could not open '%s': Block protocol '%s' doesn't support the option '%s'", opts,
                              proto ? (fd ? fd : "file") : driver, proto ? k.key[i] + 5 : k.key[i]);
            } else {
                qk_tool_error("Could not open '%s': Block format '%s' does not support the option '%s'", opts,
                              driver, k.key[i]);
            }
            free(name);
            name = NULL;
        }
    }
out:
    keys_free(&k);
    return name;
}

/* What the rewrite allocated, freed by qk_tool_image_opts_free(). */
static char **made_argv;
static char **made_names;
static int made_nnames;

void qk_tool_image_opts_free(void)
{
    for (int i = 0; i < made_nnames; i++) {
        free(made_names[i]);
    }
    free(made_names);
    free(made_argv);
    made_names = made_argv = NULL;
    made_nnames = 0;
}

static bool has_driver_key(const char *arg)
{
    return arg[0] != '-' && (strncmp(arg, "driver=", 7) == 0 || strstr(arg, ",driver="));
}

int qk_tool_image_opts(int *argc, char ***argv)
{
    int n = *argc;
    char **av = *argv;
    bool image_opts = false, target_opts = false;
    for (int i = 1; i < n && strcmp(av[i], "--") != 0; i++) {
        image_opts |= strcmp(av[i], "--image-opts") == 0;
        target_opts |= strcmp(av[i], "--target-image-opts") == 0;
    }
    if (!image_opts && !target_opts) {
        return 0;
    }
    const char *flag1 = NULL, *flag2 = NULL;
    for (size_t c = 0; c < sizeof(commands) / sizeof(commands[0]); c++) {
        if (strcmp(av[0], commands[c].cmd) == 0) {
            flag1 = commands[c].flag1;
            flag2 = commands[c].flag2;
        }
    }
    bool convert = strcmp(av[0], "convert") == 0;
    if (!flag1 || (target_opts && !convert)) {
        qk_tool_error("%s is not supported by '%s'", target_opts && !convert ? "--target-image-opts" : "--image-opts",
                      av[0]);
        return -1;
    }
    /* Room for the arguments plus a format flag and value per image. */
    char **out = calloc((size_t)n * 3 + 1, sizeof(char *));
    int *lists = calloc((size_t)n, sizeof(int));
    made_names = calloc((size_t)n, sizeof(char *));
    made_argv = out;
    if (!out || !lists || !made_names) {
        qk_tool_image_opts_free();
        free(lists);
        qk_tool_error("out of memory");
        return -1;
    }
    int nl = 0;
    bool has_n = false;
    for (int i = 1; i < n; i++) {
        if (has_driver_key(av[i])) {
            lists[nl++] = i;
        }
        has_n |= strcmp(av[i], "-n") == 0;
    }
    int first_src = 0, nsrc = nl;
    if (convert && target_opts) {
        if (!has_n) {
            qk_tool_error("--target-image-opts requires use of -n flag");
            goto fail;
        }
        if (nl == 0) {
            qk_tool_error("--target-image-opts: the target is not given as driver=...");
            goto fail;
        }
        nsrc = nl - 1; /* the target is the last one */
    }
    /* Every image of the command is a key list (as for qemu-img, where a
     * plain name would be read as file=NAME): which flag a format goes
     * with depends on the image's place. */
    int want = flag2 ? 2 : 1;
    if (image_opts && (convert ? nsrc == 0 : nsrc != want)) {
        qk_tool_error("--image-opts: '%s' takes %s given as driver=...", av[0],
                      convert ? "its sources" : want == 2 ? "both images" : "the image");
        goto fail;
    }
    if (!image_opts) {
        first_src = nsrc; /* only the target is a key list */
    }
    /* The command's own format flags must not name a key list's format. */
    for (int i = 1; i < n; i++) {
        bool f = strcmp(av[i], "-f") == 0 || strncmp(av[i], "--format", 8) == 0;
        bool f2 = flag2 && strcmp(av[i], flag2) == 0;
        bool o = strcmp(av[i], "-O") == 0;
        if (((f || f2) && image_opts) || (o && target_opts)) {
            qk_tool_error("--image-opts and --format are mutually exclusive");
            goto fail;
        }
    }
    int m = 0;
    out[m++] = av[0];
    const char *src_fmt = NULL;
    for (int j = first_src; j < nl; j++) {
        bool target = convert && target_opts && j == nl - 1;
        const char *fmt = NULL;
        char *name = translate(av[lists[j]], &fmt);
        if (!name) {
            goto fail;
        }
        made_names[made_nnames++] = name;
        av[lists[j]] = name;
        const char *flag = target ? "-O" : j == 1 && flag2 ? flag2 : flag1;
        if (!target && convert) {
            /* convert takes one -f for all its sources. */
            if (src_fmt && strcmp(src_fmt, fmt) != 0) {
                qk_tool_error("--image-opts: convert's sources must share one format");
                goto fail;
            }
            if (src_fmt) {
                continue;
            }
            src_fmt = fmt;
        }
        out[m++] = (char *)flag;
        out[m++] = (char *)fmt;
    }
    for (int i = 1; i < n; i++) {
        if (strcmp(av[i], "--image-opts") != 0 && strcmp(av[i], "--target-image-opts") != 0) {
            out[m++] = av[i];
        }
    }
    out[m] = NULL;
    free(lists);
    *argc = m;
    *argv = out;
    return 0;
fail:
    qk_tool_image_opts_free();
    free(lists);
    return -1;
}
