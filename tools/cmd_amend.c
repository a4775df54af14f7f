/*
 * qcowkit amend: changes options of an existing image (qemu-img amend -o):
 * compat (0.10/v2, 1.1/v3), lazy_refcounts, refcount_bits and size; the
 * options only create can set, the backing file (rebase's job) and
 * encryption are refused with qemu-img's messages. Same flags, messages
 * and exit codes.
 *
 * Owns parsing the option list; the changes, their order and every
 * refusal that depends on the image are the format driver's
 * (src/qcow2/amend.c).
 */
#include "cmd.h"
#include "progress.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char *const usage_text =
    "Usage: qcowkit amend [-p] [-q] [-f FMT] [-t CACHE] [--force] -o OPTIONS FILE\n"
    "\n"
    "Changes options of an existing image; OPTIONS is a comma-separated list\n"
    "(-o help lists them):\n"
    "  compat=0.10|1.1     the qcow2 version (v2, v3); a downgrade turns zero\n"
    "                      clusters into what v2 can hold\n"
    "  lazy_refcounts=on|off\n"
    "  refcount_bits=N     1, 2, 4, 8, 16, 32 or 64 (rebuilds the refcount structure)\n"
    "  size=SIZE           the virtual size (as resize, smaller allowed)\n"
    "  -f FMT     format of FILE (default: probed)\n"
    "  -t CACHE   none, writeback (default), writethrough, directsync, unsafe\n"
    "  -p         show progress on stderr\n"
    "  -q         quiet\n"
    "  --force    accepted for qemu-img compatibility\n";

static const char *const amend_help =
    "Amend options for 'qcow2':\n"
    "  backing_file=<str>     - File name of a base image\n"
    "  backing_fmt=<str>      - Image format of the base image\n"
    "  compat=<str>           - Compatibility level (v2 [0.10] or v3 [1.1])\n"
    "  data_file=<str>        - File name of an external data file\n"
    "  data_file_raw=<bool (on/off)> - The external data file must stay valid as a raw image\n"
    "  encrypt.iter-time=<num> - Time to spend in PBKDF in milliseconds\n"
    "  encrypt.keyslot=<num>  - Select a single keyslot to modify explicitly\n"
    "  encrypt.new-secret=<str> - New secret to set in the matching keyslots. Empty string to erase\n"
    "  encrypt.old-secret=<str> - Select all keyslots that match this password\n"
    "  encrypt.state=<str>    - Select new state of affected keyslots (active/inactive)\n"
    "  lazy_refcounts=<bool (on/off)> - Postpone refcount updates\n"
    "  refcount_bits=<num>    - Width of a reference count entry in bits\n"
    "  size=<size>            - Virtual disk size\n";

typedef struct AmendCmd {
    QkBlock *bs;
    QkAmendOptions o;
    const char *backing_file, *backing_fmt;
    bool backing_given;
    QkProgress progress;
    QkError err;
    int ret;
} AmendCmd;

static void coroutine_fn amend_co(void *opaque)
{
    AmendCmd *c = opaque;
    c->ret = qk_co_amend(c->bs, &c->o, &c->err);
}

static bool is_creation_only(const char *key)
{
    static const char *const keys[] = {
        "cluster_size", "extended_l2", "compression_type", "preallocation", "encryption", "nocow",
        "encrypt.format", "encrypt.cipher-alg", "encrypt.cipher-mode", "encrypt.hash-alg",
        "encrypt.ivgen-alg", "encrypt.ivgen-hash-alg", "encrypt.key-secret", "encrypt.slot-secret",
    };
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        if (strcmp(key, keys[i]) == 0) {
            return true;
        }
    }
    return false;
}

/* One key=value of the -o list; 0, or 1 after printing the error. */
static int parse_one(AmendCmd *c, char *kv)
{
    char *eq = strchr(kv, '=');
    const char *v = eq ? eq + 1 : NULL;
    if (eq) {
        *eq = '\0';
    }
    if (strcmp(kv, "compat") == 0) {
        const char *lv = v ? v : "";
        if (strcmp(lv, "0.10") == 0 || strcmp(lv, "v2") == 0) {
            c->o.compat = 2;
        } else if (strcmp(lv, "1.1") == 0 || strcmp(lv, "v3") == 0) {
            c->o.compat = 3;
        } else {
            qk_tool_error("Unknown compatibility level %s", lv);
            return 1;
        }
    } else if (strcmp(kv, "lazy_refcounts") == 0) {
        if (!v || strcmp(v, "on") == 0) {
            c->o.lazy_refcounts = 1;
        } else if (strcmp(v, "off") == 0) {
            c->o.lazy_refcounts = 0;
        } else {
            qk_tool_error("Parameter 'lazy_refcounts' expects 'on' or 'off'");
            return 1;
        }
    } else if (strcmp(kv, "refcount_bits") == 0) {
        uint64_t n;
        if (!v || qk_parse_uint(v, &n) < 0) {
            qk_tool_error("Parameter 'refcount_bits' expects a number");
            return 1;
        }
        if (n == 0 || n > 64 || (n & (n - 1))) {
            qk_tool_error("Refcount width must be a power of two and may not exceed 64 bits");
            return 1;
        }
        c->o.refcount_bits = (uint32_t)n;
    } else if (strcmp(kv, "size") == 0) {
        if (!v || qk_tool_size(v, &c->o.size) < 0) {
            qk_tool_error("Parameter 'size' expects a non-negative number below 2^64");
            fprintf(stderr, "Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta-\n"
                            "and exabytes, respectively.\n");
            return 1;
        }
        c->o.size_set = true;
    } else if (strcmp(kv, "backing_file") == 0) {
        c->backing_file = v ? v : "";
        c->backing_given = true;
    } else if (strcmp(kv, "backing_fmt") == 0) {
        c->backing_fmt = v ? v : "";
        c->backing_given = true;
    } else if (strcmp(kv, "data_file") == 0) {
        c->o.data_file = v ? v : "";
    } else if (strcmp(kv, "data_file_raw") == 0) {
        if (qk_tool_parse_bool("", kv, v ? v : "on", &c->o.data_file_raw) < 0) {
            return 1;
        }
        c->o.data_file_raw_set = true;
    } else if (is_creation_only(kv)) {
        qk_tool_error("Invalid parameter '%s'", kv);
        fprintf(stderr, "This option is only supported for image creation\n");
        return 1;
    } else if (strncmp(kv, "encrypt.", 8) == 0) {
        qk_tool_error("Can't amend encryption options - encryption not present");
        return 1;
    } else {
        qk_tool_error("Invalid parameter '%s'", kv);
        return 1;
    }
    return 0;
}

/* strcmp where NULL (not given, or none recorded) equals only NULL. */
static bool differ0(const char *a, const char *b)
{
    return (!a || !b) ? a != b : strcmp(a, b) != 0;
}

/* Backing file options equal to what the image records change nothing;
 * any other is rebase's job, as qemu-img says. As in qemu-img, the file
 * and the format must both match (one given alone differs from a
 * recorded other). */
static bool backing_differs(const AmendCmd *c)
{
    return differ0(c->backing_file, qk_block_backing_file(c->bs)) ||
           differ0(c->backing_fmt, qk_block_backing_format(c->bs));
}

/* "help" or "?" anywhere in the -o list asks for the list of options. */
static bool wants_help(const char *options)
{
    char *copy = strdup(options), *cursor = copy;
    bool help = false;
    for (char *kv = copy ? qk_tool_opt_next(&cursor) : NULL; kv && !help; kv = qk_tool_opt_next(&cursor)) {
        help = strcmp(kv, "help") == 0 || strcmp(kv, "?") == 0;
    }
    free(copy);
    return help;
}

/* The options FMT can amend; 0, or 1 after the message. */
static int print_help(const char *fmt)
{
    if (strcmp(fmt, "qcow2") == 0) {
        fputs(amend_help, stdout);
        return 0;
    }
    if (!qk_format_known(fmt)) {
        qk_tool_error("Unknown file format '%s'", fmt);
    } else {
        qk_tool_error("Format driver '%s' does not support option amendment", fmt);
    }
    return 1;
}

static int run_amend(int argc, char **argv)
{
    const char *fmt = NULL, *cache = NULL;
    char *options = NULL;
    bool quiet = false, progress = false;
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"force", no_argument, NULL, 'F'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    int opt, ret = 1;
    while ((opt = getopt_long(argc, argv, ":f:t:o:pqh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f':
            fmt = optarg;
            break;
        case 't':
            cache = optarg;
            break;
        case 'o': {
            if (!qk_tool_opt_list_valid(optarg)) {
                free(options);
                qk_tool_error("Invalid option list: %s", optarg);
                return 1;
            }
            /* Several -o add up, as with qemu-img. */
            size_t n = (options ? strlen(options) + 1 : 0) + strlen(optarg) + 1;
            char *m = malloc(n);
            if (!m) {
                free(options);
                qk_tool_error("out of memory");
                return 1;
            }
            snprintf(m, n, "%s%s%s", options ? options : "", options ? "," : "", optarg);
            free(options);
            options = m;
            break;
        }
        case 'p':
            progress = true;
            break;
        case 'q':
            quiet = true;
            break;
        case 'F':
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 0;
        case ':':
            return qk_tool_bad_usage("amend", "missing argument for option '%s'", argv[optind - 1]);
        default:
            return qk_tool_bad_usage("amend", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    AmendCmd c = {.o = {.lazy_refcounts = -1}};
    if (!options) {
        qk_tool_error("Must specify options (-o)");
        fprintf(stderr, "Try '%s --help' for more information\n", qk_progname);
        return 1;
    }
    bool help = wants_help(options);
    if (help && fmt) {
        /* With the format given, no image is needed (qemu-img's order). */
        ret = print_help(fmt);
        goto out;
    }
    if (optind != argc - 1) {
        qk_tool_error("Expecting one image file name");
        goto out;
    }
    const char *filename = argv[optind];
    int flags = QK_OPEN_RDWR | QK_OPEN_NO_BACKING;
    if (cache && qk_cache_mode_parse(cache, &flags) < 0) {
        qk_tool_error("Invalid cache option: %s", cache);
        goto out;
    }
    /* Refusals first, on a read-only open: a read-write open already
     * updates the header (it clears the autoclear bits it cannot keep).
     * It shares the image: the read-write open is the one whose lock
     * counts, and says what qemu-img says when the image is in use. */
    c.bs = qk_tool_open(filename, fmt, (flags & ~QK_OPEN_RDWR) | QK_OPEN_FORCE_SHARE, &c.err);
    if (!c.bs) {
        qk_tool_error("Could not open '%s': %s", filename, c.err.msg);
        goto out;
    }
    if (help) {
        ret = print_help(qk_block_format_name(c.bs));
        goto out;
    }
    if (!qk_block_can_amend(c.bs)) {
        qk_tool_error("Format driver '%s' does not support option amendment", qk_block_format_name(c.bs));
        goto out;
    }
    char *cursor = options;
    for (char *kv = qk_tool_opt_next(&cursor); kv; kv = qk_tool_opt_next(&cursor)) {
        if (parse_one(&c, kv)) {
            goto out;
        }
    }
    if (c.backing_given && backing_differs(&c)) {
        qk_tool_error("Cannot amend the backing file");
        fprintf(stderr, "You can use 'qemu-img rebase' instead.\n");
        goto out;
    }
    c.o.check_only = true;
    qk_co_run(amend_co, &c);
    qk_block_close(c.bs);
    c.bs = NULL;
    if (c.ret < 0) {
        qk_tool_error("%s", c.err.msg);
        goto out;
    }
    c.o.check_only = false;
    if (c.o.size_set) {
        /* Growing must know what the backing file would show through the
         * new area (and the last cluster's old tail) to zero it. */
        flags &= ~QK_OPEN_NO_BACKING;
    }
    c.bs = qk_tool_open(filename, fmt, flags, &c.err);
    if (!c.bs) {
        qk_tool_error("Could not open '%s': %s", filename, c.err.msg);
        goto out;
    }
    qk_progress_init(&c.progress, stdout, progress && !quiet);
    qk_progress_update(&c.progress, 0, 1);
    c.o.progress = qk_progress_report;
    c.o.opaque = &c.progress;
    qk_co_run(amend_co, &c);
    if (c.ret < 0) {
        qk_tool_error("%s", c.err.msg);
        goto out;
    }
    qk_progress_finish(&c.progress);
    ret = 0;
out:
    free(options);
    return qk_tool_close_written(c.bs, ret, true, "");
}

const QkCommand qk_cmd_amend = {
    .name = "amend",
    .summary = "change the options of an existing image",
    .usage = usage_text,
    .run = run_amend,
};
