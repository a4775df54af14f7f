/*
 * The -o creation-option lists that create and convert share: their
 * syntax (one name=value at a time, as qemu-img reads them) and the checks
 * of their meaning qemu-img makes once it creates the image.
 *
 * Parsing and checking are apart because qemu-img reports them at
 * different moments: syntax first, meaning only after create's
 * "Formatting" line (or, in convert, after the sources are open).
 */
#include "cmd.h"

#include <stdio.h>
#include <string.h>

/* qemu-img's wording for a size it cannot read; prefix is "" or "FILE: ". */
static int parse_opt_size(const char *prefix, const char *name, const char *v, uint64_t *out)
{
    if (qk_tool_size(v, out) < 0) {
        qk_tool_error("%sParameter '%s' expects a non-negative number below 2^64", prefix, name);
        fputs("Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta-\n"
              "and exabytes, respectively.\n", stderr);
        return -1;
    }
    return 0;
}

void qk_tool_create_opts_help(bool qcow2, const char *kind)
{
    printf("Supported %soptions:\n", kind);
    if (qcow2) {
        fputs("  backing_file=<str>     - File name of a base image\n"
              "  backing_fmt=<str>      - Image format of the base image\n"
              "  cluster_size=<size>    - qcow2 cluster size\n"
              "  compat=<str>           - Compatibility level (v2 [0.10] or v3 [1.1])\n"
              "  compression_type=<str> - Compression method used for image cluster compression\n"
              "  data_file=<str>        - File name of an external data file\n"
              "  data_file_raw=<bool (on/off)> - The external data file must stay valid as a raw image\n"
              "  extended_l2=<bool (on/off)> - Extended L2 tables\n"
              "  lazy_refcounts=<bool (on/off)> - Postpone refcount updates\n"
              "  preallocation=<str>    - Preallocation mode (allowed values: off, metadata, falloc, full)\n"
              "  refcount_bits=<num>    - Width of a reference count entry in bits\n",
              stdout);
    } else {
        fputs("  preallocation=<str>    - Preallocation mode (allowed values: off, falloc, full)\n", stdout);
    }
    fputs("  size=<size>            - Virtual disk size\n", stdout);
}

bool qk_tool_opt_list_valid(const char *list)
{
    /* qemu-img's rule: not empty, no leading comma, and no lone comma at
     * the end (",," there is an escaped comma in the last value). */
    if (!list[0] || list[0] == ',') {
        return false;
    }
    size_t len = strlen(list), i = len;
    while (i > 0 && list[i - 1] == ',') {
        i--;
    }
    return (len - i) % 2 == 0;
}

bool qk_tool_opt_lists_want_help(char *const *lists, int n)
{
    for (int i = 0; i < n; i++) {
        char copy[4096];
        snprintf(copy, sizeof(copy), "%s", lists[i]);
        char *cursor = copy;
        for (char *kv = qk_tool_opt_next(&cursor); kv; kv = qk_tool_opt_next(&cursor)) {
            if (strcmp(kv, "help") == 0 || strcmp(kv, "?") == 0) {
                return true;
            }
        }
    }
    return false;
}

char *qk_tool_opt_next(char **cursor)
{
    char *p = *cursor;
    while (*p == ',' && p[1] != ',') {
        p++; /* empty items are skipped */
    }
    if (!*p) {
        *cursor = p;
        return NULL;
    }
    char *item = p, *w = p;
    while (*p && !(*p == ',' && p[1] != ',')) {
        if (*p == ',') {
            p++; /* ",," is a comma of the value */
        }
        *w++ = *p++;
    }
    if (*p == ',') {
        p++;
    }
    *w = '\0';
    *cursor = p;
    return item;
}

static int apply_opt(QkToolCreateOpts *a, bool qcow2, char *kv, const char *prefix)
{
    char *eq = strchr(kv, '=');
    const char *v = "on";
    if (eq) {
        *eq = '\0';
        v = eq + 1;
    }
    uint64_t n;
    if (strcmp(kv, "size") == 0) {
        if (parse_opt_size(prefix, kv, v, &n) < 0) {
            return -1;
        }
        a->o.size = n;
        a->o.size_set = true;
    } else if (strcmp(kv, "preallocation") == 0) {
        a->prealloc = v;
    } else if (qcow2 && strcmp(kv, "cluster_size") == 0) {
        if (parse_opt_size(prefix, kv, v, &n) < 0) {
            return -1;
        }
        a->o.cluster_size = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
        a->cluster_size_set = true;
    } else if (qcow2 && strcmp(kv, "refcount_bits") == 0) {
        if (qk_parse_uint(v, &n) < 0) {
            qk_tool_error("%sParameter '%s' expects a number", prefix, kv);
            return -1;
        }
        a->o.refcount_bits = n > 1024 ? 1024 : (uint32_t)n;
    } else if (qcow2 && strcmp(kv, "lazy_refcounts") == 0) {
        if (qk_tool_parse_bool(prefix, kv, v, &a->o.lazy_refcounts) < 0) {
            return -1;
        }
        a->lazy = v;
    } else if (qcow2 && strcmp(kv, "extended_l2") == 0) {
        return qk_tool_parse_bool(prefix, kv, v, &a->o.extended_l2);
    } else if (qcow2 && strcmp(kv, "compat") == 0) {
        a->compat = v;
    } else if (qcow2 && strcmp(kv, "compression_type") == 0) {
        a->compression = v;
    } else if (qcow2 && strcmp(kv, "backing_file") == 0) {
        a->o.backing_file = v;
    } else if (qcow2 && strcmp(kv, "backing_fmt") == 0) {
        a->o.backing_fmt = v;
    } else if (qcow2 && strcmp(kv, "data_file") == 0) {
        a->o.data_file = v;
    } else if (qcow2 && strcmp(kv, "data_file_raw") == 0) {
        if (qk_tool_parse_bool(prefix, kv, v, &a->o.data_file_raw) < 0) {
            return -1;
        }
        a->data_file_raw = v;
    } else {
        qk_tool_error("%sInvalid parameter '%s'", prefix, kv);
        return -1;
    }
    return 0;
}

int qk_tool_create_opts_parse(QkToolCreateOpts *a, bool qcow2, char *list, const char *prefix)
{
    if (!qk_tool_opt_list_valid(list)) {
        qk_tool_error("Invalid option list: %s", list);
        return -1;
    }
    char *cursor = list;
    for (char *kv = qk_tool_opt_next(&cursor); kv; kv = qk_tool_opt_next(&cursor)) {
        if (apply_opt(a, qcow2, kv, prefix) < 0) {
            return -1;
        }
    }
    return 0;
}

static int parse_prealloc(const char *s, bool qcow2, QkPrealloc *p)
{
    static const char *const names[] = {"off", "metadata", "falloc", "full"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(s, names[i]) == 0 && (qcow2 || i != QK_PREALLOC_METADATA)) {
            *p = (QkPrealloc)i;
            return 0;
        }
    }
    return -1;
}

const char *qk_tool_create_opts_check(QkToolCreateOpts *a, bool qcow2, char *why, size_t len)
{
    QkCreateOptions *o = &a->o;
    if (a->prealloc && parse_prealloc(a->prealloc, qcow2, &o->prealloc) < 0) {
        snprintf(why, len, "Parameter 'preallocation' does not accept value '%s'", a->prealloc);
        return why;
    }
    if (!qcow2) {
        return NULL;
    }
    if (a->compat) {
        if (strcmp(a->compat, "0.10") == 0 || strcmp(a->compat, "v2") == 0) {
            o->compat = 2;
        } else if (strcmp(a->compat, "1.1") == 0 || strcmp(a->compat, "v3") == 0) {
            o->compat = 3;
        } else {
            snprintf(why, len, "Parameter 'version' does not accept value '%s'", a->compat);
            return why;
        }
    }
    if (strcmp(a->compression, "zlib") == 0) {
        o->compression_type = 0;
    } else if (strcmp(a->compression, "zstd") == 0) {
        o->compression_type = 1;
    } else {
        snprintf(why, len, "Parameter 'compression-type' does not accept value '%s'", a->compression);
        return why;
    }
    uint32_t cs = o->cluster_size ? o->cluster_size : 65536;
    if (a->cluster_size_set && (cs < 512 || cs > (2u << 20) || (cs & (cs - 1)))) {
        return "Cluster size must be a power of two between 512 and 2048k";
    }
    uint32_t rb = o->refcount_bits ? o->refcount_bits : 16;
    if (rb > 64 || (rb & (rb - 1)) || rb == 0) {
        return "Refcount width must be a power of two and may not exceed 64 bits";
    }
    if (o->compat == 2) {
        if (o->lazy_refcounts) {
            return "Lazy refcounts only supported with compatibility level 1.1 and above (use version=v3 or greater)";
        }
        if (rb != 16) {
            return "Different refcount widths than 16 bits require compatibility level 1.1 or above "
                   "(use version=v3 or greater)";
        }
        if (o->compression_type != 0) {
            return "Non-zlib compression type is only supported with compatibility level 1.1 and above "
                   "(use version=v3 or greater)";
        }
        if (o->extended_l2) {
            return "Extended L2 entries are only supported with compatibility level 1.1 and above "
                   "(use version=v3 or greater)";
        }
    }
    if (o->data_file_raw && !o->data_file) {
        return "data-file-raw requires data-file";
    }
    if (o->data_file && o->compat == 2) {
        return "External data files are only supported with compatibility level 1.1 and above "
               "(use version=v3 or greater)";
    }
    if (o->data_file_raw && o->backing_file) {
        return "Backing file and data-file-raw cannot be used at the same time";
    }
    if (o->extended_l2 && cs < 16384) {
        return "Extended L2 entries are only supported with cluster sizes of at least 16384 bytes";
    }
    if (o->backing_fmt && !o->backing_file) {
        return "Backing format cannot be used without backing file";
    }
    if (o->backing_file && o->prealloc != QK_PREALLOC_OFF && !o->extended_l2) {
        return "Backing file and preallocation can only be used at the same time if extended_l2 is on";
    }
    return NULL;
}
