/*
 * qcowkit measure: how large a new qcow2 or raw image would be (qemu-img
 * measure), for a given virtual size or for the contents of an existing
 * image: the bytes a copy needs ("required"), with every cluster allocated
 * ("fully allocated") and, for qcow2 from a qcow2 v3 input, the persistent
 * bitmaps a copy would carry. Same options, numbers, messages and exit
 * codes as qemu-img 7.2.
 *
 * Owns the -o parsing for measure (qemu-img checks a different subset of
 * the creation options here than create does, with other wording), the
 * qcow2 size arithmetic derived from the format, the allocation count of
 * an input image and the reading of its bitmap directory.
 */
#include "cmd.h"
#include "common/checked.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const usage_text =
    "Usage: qcowkit measure [--output=human|json] [-O OUTPUT_FMT] [-o OPTIONS] [--size N | [-f FMT] [-l SNAPSHOT] [-U] FILE]\n"
    "\n"
    "Prints how many bytes a new image in OUTPUT_FMT needs: for a virtual size of\n"
    "N bytes (k, M, G, T, P, E suffixes), or for the contents of FILE (its\n"
    "allocated data, across its backing chain).\n"
    "  -O FMT         format of the new image: raw (default) or qcow2\n"
    "  -o OPTIONS     creation options of the new image: cluster_size,\n"
    "                 refcount_bits, extended_l2, preallocation, compat, ...\n"
    "  --size N       measure an empty image of N bytes\n"
    "  -f FMT         format of FILE (default: probed)\n"
    "  -l SNAPSHOT    measure this internal snapshot of FILE: ID_OR_NAME, or\n"
    "                 snapshot.id=ID[,snapshot.name=NAME]\n"
    "  -U             open FILE even if another process uses it\n"
    "  --output=FMT   human (default) or json\n";

/* qcow2 limits the L1 table to 32 MiB of entries. */
#define L1_MAX_ENTRIES ((32u << 20) / 8)

/* The -o values measure looks at, after parsing. */
typedef struct MeasureOpts {
    bool qcow2;
    uint64_t cluster_size;
    const char *compat;        /* NULL: default 1.1 */
    uint64_t refcount_bits;
    bool cluster_size_set, refcount_bits_set;
    bool extended_l2;
    const char *prealloc;      /* NULL: off */
    const char *encrypt_format;
    bool has_backing;          /* -o backing_file: the new image has one */
} MeasureOpts;

typedef struct Result {
    uint64_t required, fully;
    bool has_bitmaps;
    uint64_t bitmaps;
} Result;

/* qemu's size syntax: optional blanks and '+', decimal (leading zeros are
 * not octal) or 0x hex, a decimal fraction only before a multiplier, one
 * suffix of b k M G T P E (either case). Returns 0, -EINVAL or -ERANGE. */
static int parse_qemu_size(const char *s, uint64_t *out)
{
    const char *p = s;
    while (isspace((unsigned char)*p)) {
        p++;
    }
    if (*p == '+') {
        p++;
    }
    if (strchr(p, '-')) {
        return -EINVAL;
    }
    bool hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
    const char *digits = hex ? p + 2 : p;
    char *end;
    errno = 0;
    uint64_t v = strtoull(digits, &end, hex ? 16 : 10);
    if (end == digits || isspace((unsigned char)*digits) || *digits == '+') {
        return -EINVAL;
    }
    bool range = errno == ERANGE;
    long double frac = 0;
    bool has_frac = false;
    if (*end == '.') {
        if (hex) {
            return -EINVAL;
        }
        const char *f = ++end;
        while (isdigit((unsigned char)*end)) {
            end++;
        }
        long double scale = 0.1L;
        for (const char *q = f; q < end; q++, scale /= 10) {
            frac += (*q - '0') * scale;
        }
        has_frac = frac != 0;
    }
    static const char suffixes[] = "bkmgtpe";
    uint64_t mul = 1;
    const char *sfx = *end ? strchr(suffixes, tolower((unsigned char)*end)) : NULL;
    if (sfx) {
        for (long i = 0; i < sfx - suffixes; i++) {
            mul *= 1024;
        }
        end++;
    }
    if (*end != '\0' || (has_frac && mul == 1)) {
        return -EINVAL;
    }
    if (hex && mul > 1) {
        fflush(stdout);
        fprintf(stderr, "%s: warning: Using a multiplier suffix on hex numbers is deprecated: %s\n",
                qk_progname, s);
    }
    if (range || v > UINT64_MAX / mul) {
        return -ERANGE;
    }
    uint64_t f = (uint64_t)(frac * (long double)mul);
    if (v * mul > UINT64_MAX - f) {
        return -ERANGE;
    }
    *out = v * mul + f;
    return 0;
}

/* qemu's -o lists: name=value or a bare name (meaning "on"); ",," is a
 * comma inside a value. Rejected as a whole when empty or ending in a
 * single comma, as qemu-img does before looking at anything else. */
static bool valid_opt_list(const char *l)
{
    size_t n = strlen(l);
    if (n == 0) {
        return false;
    }
    size_t commas = 0;
    while (commas < n && l[n - 1 - commas] == ',') {
        commas++;
    }
    return commas % 2 == 0;
}

/* Reports a bad -o list the way qemu-img does: the reason, then which
 * format's options were being parsed. */
static int opt_error(const char *fmt, const char *msg, const char *name, bool size_hint)
{
    qk_tool_error(msg, name);
    if (size_hint) {
        fprintf(stderr, "Optional suffix k, M, G, T, P or E means kilo-, mega-, giga-, tera-, peta-\n"
                        "and exabytes, respectively.\n");
    }
    qk_tool_error("Invalid options for file format '%s'", fmt);
    return -1;
}

static int parse_bool(const char *v, bool *out)
{
    if (strcmp(v, "on") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "y") == 0) {
        *out = true;
    } else if (strcmp(v, "off") == 0 || strcmp(v, "no") == 0 || strcmp(v, "false") == 0 ||
               strcmp(v, "n") == 0) {
        *out = false;
    } else {
        return -1;
    }
    return 0;
}

/* One name=value, typed as the output format's creation options are. */
static int apply_opt(MeasureOpts *m, const char *fmt, char *name, char *v)
{
    /* Options of the format that measure does not look at, by type. */
    static const char *const q_strings[] = {"backing_file", "backing_fmt", "data_file", "compression_type",
                                            "encrypt.key-secret", "encrypt.cipher-alg", "encrypt.cipher-mode",
                                            "encrypt.ivgen-alg", "encrypt.ivgen-hash-alg", "encrypt.hash-alg",
                                            NULL};
    static const char *const q_bools[] = {"lazy_refcounts", "encryption", "data_file_raw", NULL};
    uint64_t n;
    bool b;
    if (strcmp(name, "size") == 0) {
        if (parse_qemu_size(v, &n) < 0) {
            return opt_error(fmt, "Parameter '%s' expects a non-negative number below 2^64", name, true);
        }
        return 0; /* qemu-img measure takes the size from --size or the input */
    }
    if (strcmp(name, "preallocation") == 0) {
        m->prealloc = v;
        return 0;
    }
    if (strcmp(name, "backing_file") == 0 && m->qcow2) {
        m->has_backing = true; /* and checked as a string below */
    }
    if (!m->qcow2) {
        return opt_error(fmt, "Invalid parameter '%s'", name, false);
    }
    if (strcmp(name, "cluster_size") == 0) {
        if (parse_qemu_size(v, &m->cluster_size) < 0) {
            return opt_error(fmt, "Parameter '%s' expects a non-negative number below 2^64", name, true);
        }
        m->cluster_size_set = true;
    } else if (strcmp(name, "refcount_bits") == 0 || strcmp(name, "encrypt.iter-time") == 0) {
        char *end;
        errno = 0;
        n = strtoull(v, &end, 0);
        if (!*v || *end || errno || strchr(v, '-')) {
            return opt_error(fmt, "Parameter '%s' expects a number", name, false);
        }
        if (name[0] == 'r') {
            m->refcount_bits = n;
            m->refcount_bits_set = true;
        }
    } else if (strcmp(name, "extended_l2") == 0) {
        if (parse_bool(v, &m->extended_l2) < 0) {
            return opt_error(fmt, "Parameter '%s' expects 'on' or 'off'", name, false);
        }
    } else if (strcmp(name, "compat") == 0) {
        m->compat = v;
    } else if (strcmp(name, "encrypt.format") == 0) {
        m->encrypt_format = v;
    } else {
        for (int i = 0; q_bools[i]; i++) {
            if (strcmp(name, q_bools[i]) == 0) {
                if (parse_bool(v, &b) < 0) {
                    return opt_error(fmt, "Parameter '%s' expects 'on' or 'off'", name, false);
                }
                return 0;
            }
        }
        for (int i = 0; q_strings[i]; i++) {
            if (strcmp(name, q_strings[i]) == 0) {
                return 0;
            }
        }
        return opt_error(fmt, "Invalid parameter '%s'", name, false);
    }
    return 0;
}

/* Splits one list (in place) into name=value pairs, undoing ",,". */
static int apply_opt_list(MeasureOpts *m, const char *fmt, char *list)
{
    char *p = list;
    while (*p) {
        char *item = p, *w = p;
        while (*p && !(*p == ',' && p[1] != ',')) {
            if (*p == ',') {
                p++; /* ",," */
            }
            *w++ = *p++;
        }
        if (*p == ',') {
            p++;
        }
        *w = '\0';
        char *eq = strchr(item, '=');
        char *v = (char *)"on";
        if (eq) {
            *eq = '\0';
            v = eq + 1;
        }
        if (apply_opt(m, fmt, item, v) < 0) {
            return -1;
        }
    }
    return 0;
}

static uint64_t div_up(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

/* The checks qemu-img's qcow2 measure makes, in its order. */
static int validate_qcow2(const MeasureOpts *m, uint64_t *cs, uint64_t *rb)
{
    *cs = m->cluster_size_set ? m->cluster_size : 65536;
    if (*cs < 512 || *cs > (2u << 20) || (*cs & (*cs - 1))) {
        qk_tool_error("Cluster size must be a power of two between 512 and 2048k");
        return -1;
    }
    if (m->extended_l2 && *cs < 16384) {
        qk_tool_error("Extended L2 entries are only supported with cluster sizes of at least 16384 bytes");
        return -1;
    }
    bool v2 = false;
    if (m->compat) {
        if (strcmp(m->compat, "0.10") == 0) {
            v2 = true;
        } else if (strcmp(m->compat, "1.1") != 0) {
            qk_tool_error("Invalid compatibility level: '%s'", m->compat);
            return -1;
        }
    }
    *rb = m->refcount_bits_set ? m->refcount_bits : 16;
    if (*rb == 0 || *rb > 64 || (*rb & (*rb - 1))) {
        qk_tool_error("Refcount width must be a power of two and may not exceed 64 bits");
        return -1;
    }
    if (v2 && *rb != 16) {
        qk_tool_error("Different refcount widths than 16 bits require compatibility level 1.1 or above "
                      "(use compat=1.1 or greater)");
        return -1;
    }
    if (m->prealloc && strcmp(m->prealloc, "off") != 0 && strcmp(m->prealloc, "metadata") != 0 &&
        strcmp(m->prealloc, "falloc") != 0 && strcmp(m->prealloc, "full") != 0) {
        qk_tool_error("invalid parameter value: %s", m->prealloc);
        return -1;
    }
    if (m->encrypt_format) {
        /* qemu-img needs a secret object for this, which qcowkit has no way to take. */
        qk_tool_error("Parameter 'encrypt.key-secret' is required for cipher");
        return -1;
    }
    return 0;
}

/* Bytes of a fully allocated qcow2 image of vsize bytes: header cluster,
 * L1 and L2 tables, data, and the refcount table and blocks, which must
 * also count themselves (hence the fixed point). 0 when the L1 table
 * would exceed qcow2's limit. */
static uint64_t qcow2_full_size(uint64_t vsize, uint64_t cs, uint64_t rb, bool ext_l2)
{
    uint64_t data = div_up(vsize, cs);
    uint64_t l2_entries = cs / (ext_l2 ? 16 : 8);
    uint64_t l2 = div_up(data, l2_entries);
    if (l2 > L1_MAX_ENTRIES) {
        return 0;
    }
    uint64_t l1 = div_up(l2 * 8, cs);
    uint64_t clusters = 1 + l1 + l2 + data;
    uint64_t per_block = cs * 8 / rb, per_table = cs / 8;
    uint64_t blocks = 0, table = 0;
    for (;;) {
        uint64_t nb = div_up(clusters + blocks + table, per_block);
        uint64_t nt = div_up(nb, per_table);
        if (nb == blocks && nt == table) {
            break;
        }
        blocks = nb;
        table = nt;
    }
    return (clusters + blocks + table) * cs;
}

#define MAX_LAYERS 256

typedef struct Walk {
    QkBlock *bs;
    bool prealloc[MAX_LAYERS];   /* layer looks metadata-preallocated */
    int nlayers;
    uint64_t size, cs;
    uint64_t data;     /* bytes of output clusters holding data */
    int ret;
} Walk;

/* Status of [off, off+bytes) across the chain, with data whose host
 * space the file reports as a hole counted as zeros (as qemu-img does:
 * preallocated metadata with no data written reads as zeros; asked only
 * of layers that look preallocated, as qemu-img asks). Returns
 * whether the range holds data, or -errno. */
static int coroutine_fn range_has_data(const Walk *w, uint64_t off, uint64_t bytes, uint64_t *pnum)
{
    uint64_t want = bytes;
    int i = 0;
    for (QkBlock *b = w->bs; b; b = qk_block_backing(b), i++) {
        uint64_t n = 0, map = 0;
        QkBlock *file = NULL;
        int r = qk_co_block_status(b, off, want, &n, &map, &file);
        if (r < 0) {
            return r;
        }
        if (r & QK_BS_EOF || n == 0) {
            *pnum = want;
            return 0;
        }
        if (!(r & QK_BS_ALLOCATED) && qk_block_backing(b)) {
            want = n;
            continue;
        }
        *pnum = n;
        if ((r & QK_BS_ZERO) || !(r & QK_BS_DATA) || !(r & QK_BS_ALLOCATED)) {
            return 0;
        }
        if (i < w->nlayers && w->prealloc[i] && (r & QK_BS_OFFSET_VALID) && file && file != b) {
            uint64_t fn = 0;
            int fr = qk_co_block_status(file, map, n, &fn, NULL, NULL);
            if (fr < 0) {
                return fr;
            }
            if (fr & QK_BS_EOF || fn == 0) {
                return 0;
            }
            *pnum = fn;
            return !(fr & QK_BS_ZERO);
        }
        return 1;
    }
    *pnum = want;
    return 0;
}

/* Counts the output clusters that hold any data of the input. */
static void coroutine_fn walk_co(void *opaque)
{
    Walk *w = opaque;
    uint64_t off = 0;
    while (off < w->size) {
        uint64_t n = 0;
        int r = range_has_data(w, off, w->size - off, &n);
        if (r < 0) {
            w->ret = r;
            return;
        }
        if (n == 0) {
            w->ret = -EIO;
            return;
        }
        uint64_t end = off + n;
        if (r) {
            /* The whole output clusters this data touches. */
            uint64_t first = off / w->cs * w->cs;
            end = QK_MIN(div_up(end, w->cs) * w->cs, div_up(w->size, w->cs) * w->cs);
            w->data += end - first;
        }
        off = end;
    }
}

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v = v << 8 | p[i];
    }
    return v;
}

/* What the input's persistent bitmaps would take in the new image: for
 * each, its data clusters (all assumed allocated) and its bitmap table,
 * plus the bitmap directory. Read from the input's header extension
 * (qcow2 v3 only; ignored unless the autoclear bit says it is valid).
 * Returns whether the input can have bitmaps at all. */
static bool input_bitmaps(const char *filename, uint64_t vsize, uint64_t cs, uint64_t *out)
{
    *out = 0;
    int fd = open(filename, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    uint8_t h[112];
    bool v3 = pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) && be(h, 4) == 0x514649fb && be(h + 4, 4) >= 3;
    if (!v3 || !(be(h + 88, 8) & 1)) {
        close(fd);
        return v3;
    }
    uint64_t in_cs = 1ull << QK_MIN(be(h + 20, 4), 31u);
    uint64_t off = be(h + 100, 4), dir_off = 0, dir_size = 0;
    uint32_t nb = 0;
    /* Extensions live in the header's first cluster. */
    while (off + 8 <= in_cs) {
        uint8_t e[8];
        if (pread(fd, e, 8, (off_t)off) != 8 || be(e, 4) == 0) {
            break;
        }
        uint64_t len = be(e + 4, 4);
        if (be(e, 4) == 0x23852875 && len >= 24) {
            uint8_t x[24];
            if (pread(fd, x, 24, (off_t)off + 8) == 24) {
                nb = (uint32_t)be(x, 4);
                dir_size = be(x + 8, 8);
                dir_off = be(x + 16, 8);
            }
            break;
        }
        off += 8 + (len + 7) / 8 * 8;
    }
    uint8_t *dir = nb && dir_size <= (64u << 20) ? malloc(dir_size) : NULL;
    if (dir && pread(fd, dir, dir_size, (off_t)dir_off) == (ssize_t)dir_size) {
        uint64_t p = 0, dir_bytes = 0;
        for (uint32_t i = 0; i < nb && p + 24 <= dir_size; i++) {
            uint64_t gran = 1ull << QK_MIN(dir[p + 17], 63);
            uint64_t name = be(dir + p + 18, 2), extra = be(dir + p + 20, 4);
            uint64_t entry = (24 + extra + name + 7) / 8 * 8;
            uint64_t bytes = div_up(div_up(vsize, gran), 8);
            uint64_t clusters = div_up(bytes, cs);
            *out += clusters * cs + div_up(clusters * 8, cs) * cs;
            /* The new image's entry has no extra data. */
            dir_bytes += (24 + name + 7) / 8 * 8;
            p += entry;
        }
        *out += div_up(dir_bytes, cs) * cs;
    }
    free(dir);
    close(fd);
    return true;
}

/* Whether a qcow2 file looks metadata-preallocated, the test qemu-img
 * makes before it trusts the host file's holes over the L2 tables. Found
 * by experiment (punching host holes into images until qemu-img's map
 * changed): the clusters in use (nonzero refcount) but one reach 11/10
 * of the whole clusters the host really stores (and half the clusters of
 * the file's length). */
static bool looks_preallocated(const char *filename)
{
    int fd = open(filename, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    uint8_t h[104];
    struct stat st;
    bool ok = fstat(fd, &st) == 0 && pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
              be(h, 4) == 0x514649fb;
    uint32_t bits = ok ? (uint32_t)be(h + 20, 4) : 0;
    if (!ok || bits < 9 || bits > 21) {
        close(fd);
        return false;
    }
    uint64_t cs = 1ull << bits;
    uint64_t order = be(h + 4, 4) >= 3 ? be(h + 96, 4) : 4;
    uint64_t rb = 1ull << QK_MIN(order, 6u);
    uint64_t len = (uint64_t)st.st_size, real = (uint64_t)st.st_blocks * 512 / cs;
    uint64_t end = div_up(len, cs), per_block = cs * 8 / rb;
    uint64_t rt_off = be(h + 48, 8), rt_entries = be(h + 56, 4) * cs / 8;
    uint64_t count = 0;
    uint8_t *blk = malloc(cs);
    for (uint64_t i = 0; blk && i < rt_entries && i * per_block < end; i++) {
        uint8_t e[8];
        if (pread(fd, e, 8, (off_t)(rt_off + i * 8)) != 8) {
            break;
        }
        uint64_t bo = be(e, 8) & 0x00fffffffffffe00ull;
        if (!bo || pread(fd, blk, cs, (off_t)bo) != (ssize_t)cs) {
            continue;
        }
        for (uint64_t j = 0; j < per_block && i * per_block + j < end; j++) {
            uint64_t bit = j * rb;
            uint64_t v = rb >= 8 ? be(blk + bit / 8, (int)(rb / 8)) : (uint64_t)(blk[bit / 8] >> (8 - rb - bit % 8)) & ((1u << rb) - 1);
            count += v != 0;
        }
    }
    free(blk);
    close(fd);
    return count > 0 && 10 * (count - 1) >= 11 * real && count - 1 >= len / cs / 2;
}

/* Notes which layers of the chain get their host holes looked at. */
static void walk_layers(Walk *w)
{
    for (QkBlock *b = w->bs; b && w->nlayers < MAX_LAYERS; b = qk_block_backing(b)) {
        w->prealloc[w->nlayers++] = strcmp(qk_block_format_name(b), "qcow2") == 0 && qk_block_filename(b) &&
                                    looks_preallocated(qk_block_filename(b));
    }
}

/* Formats qemu-img knows but cannot measure; anything else is unknown. */
static bool qemu_format(const char *f)
{
    static const char *const names[] = {
        "blkdebug", "blklogwrites", "blkverify", "bochs", "cloop", "compress", "copy-before-write",
        "copy-on-read", "dmg", "file", "ftp", "ftps", "gluster", "host_cdrom", "host_device", "http",
        "https", "iscsi", "iser", "nbd", "nfs", "null-aio", "null-co", "nvme", "parallels",
        "preallocate", "qcow", "qed", "quorum", "rbd", "replication", "snapshot-access", "ssh",
        "throttle", "vdi", "vhdx", "vmdk", "vpc", "vvfat", NULL,
    };
    for (int i = 0; names[i]; i++) {
        if (strcmp(f, names[i]) == 0) {
            return true;
        }
    }
    return false;
}

static void print_result(const Result *r, bool json)
{
    if (json) {
        json_t *j = json_object();
        if (r->has_bitmaps) {
            json_object_set_new(j, "bitmaps", json_integer((json_int_t)r->bitmaps));
        }
        json_object_set_new(j, "required", json_integer((json_int_t)r->required));
        json_object_set_new(j, "fully-allocated", json_integer((json_int_t)r->fully));
        qk_tool_print_json(j);
        json_decref(j);
        return;
    }
    printf("required size: %" PRIu64 "\n", r->required);
    printf("fully allocated size: %" PRIu64 "\n", r->fully);
    if (r->has_bitmaps) {
        printf("bitmaps size: %" PRIu64 "\n", r->bitmaps);
    }
}

/* The qcow2 figures; in is the input (NULL with --size). */
static int measure_qcow2(const MeasureOpts *m, QkBlock *in, const char *filename, uint64_t vsize, Result *r)
{
    uint64_t cs, rb;
    if (validate_qcow2(m, &cs, &rb) < 0) {
        return -1;
    }
    uint64_t full = qcow2_full_size(vsize, cs, rb, m->extended_l2);
    if (full == 0) {
        qk_tool_error("The image size is too large (try using a larger cluster size)");
        return -1;
    }
    const char *pa = m->prealloc ? m->prealloc : "off";
    bool data_prealloc = strcmp(pa, "falloc") == 0 || strcmp(pa, "full") == 0;
    uint64_t data = 0;
    if (data_prealloc || (in && m->has_backing)) {
        /* With a backing file, as qemu-img counts it: how much of the
         * input the new image's backing chain already holds is unknown,
         * so every cluster is assumed to be written. */
        data = div_up(vsize, cs) * cs;
    } else if (in) {
        Walk w = {.bs = in, .size = vsize, .cs = cs};
        walk_layers(&w);
        qk_co_run(walk_co, &w);
        if (w.ret < 0) {
            qk_tool_error("Unable to get block status: %s", strerror(-w.ret));
            return -1;
        }
        data = w.data;
    }
    r->fully = full;
    r->required = full - div_up(vsize, cs) * cs + data;
    if (in && strcmp(qk_block_format_name(in), "qcow2") == 0) {
        bool v3_out = !m->compat || strcmp(m->compat, "0.10") != 0;
        r->has_bitmaps = input_bitmaps(filename, vsize, cs, &r->bitmaps) && v3_out;
    }
    return 0;
}

static int run_measure(int argc, char **argv)
{
    const char *fmt = NULL, *out_fmt = "raw", *snapshot = NULL;
    QkToolSnapshot snap;
    bool json = false, have_size = false;
    int flags = 0;
    uint64_t size = 0;
    char *lists[32];
    int nlists = 0;
    enum { OPT_OUTPUT = 256, OPT_SIZE };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"size", required_argument, NULL, OPT_SIZE},
        {"force-share", no_argument, NULL, 'U'},
        {NULL, 0, NULL, 0},
    };
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":f:O:o:l:Uh", longopts, NULL)) != -1) {
        switch (c) {
        case 'f': fmt = optarg; break;
        case 'O': out_fmt = optarg; break;
        case 'l':
            if (!qk_tool_parse_snapshot(optarg, &snap)) {
                return 1;
            }
            snapshot = optarg;
            break;
        case 'U': flags |= QK_OPEN_FORCE_SHARE; break;
        case 'o':
            if (!valid_opt_list(optarg)) {
                qk_tool_error("Invalid option list: %s", optarg);
                return 1;
            }
            if (nlists == (int)(sizeof(lists) / sizeof(lists[0]))) {
                return qk_tool_bad_usage("measure", "too many -o options");
            }
            lists[nlists++] = optarg;
            break;
        case OPT_OUTPUT:
            if (qk_tool_parse_output("measure", optarg, &json) < 0) {
                return 1;
            }
            break;
        case OPT_SIZE: {
            int e = parse_qemu_size(optarg, &size);
            if (e == -EINVAL) {
                qk_tool_size_error("image size");
                return 1;
            }
            if (e < 0 || size > INT64_MAX) {
                qk_tool_error("Invalid image size specified. Must be between 0 and %" PRId64 ".", INT64_MAX);
                return 1;
            }
            have_size = true;
            break;
        }
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("measure", "missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_bad_usage("measure", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (argc - optind > 1) {
        qk_tool_error("At most one filename argument is allowed.");
        return 1;
    }
    const char *filename = optind < argc ? argv[optind] : NULL;
    if (filename && have_size) {
        qk_tool_error("--size N cannot be used together with a filename.");
        return 1;
    }
    if (!filename && (fmt || snapshot)) {
        qk_tool_error("--image-opts, -f, and -l require a filename argument.");
        return 1;
    }
    if (!filename && !have_size) {
        qk_tool_error("Either --size N or one filename must be specified.");
        return 1;
    }
    QkBlock *in = NULL;
    int ret = 1;
    if (filename) {
        QkError err = {0};
        in = qk_tool_open(filename, fmt, flags, &err);
        if (!in) {
            qk_tool_error("Could not open '%s': %s", filename, err.msg);
            return 1;
        }
        if (snapshot && qk_tool_load_snapshot(in, &snap) < 0) {
            goto done;
        }
        int64_t len = qk_block_length(in);
        if (len < 0) {
            qk_tool_error("Unable to get image virtual_size: %s", strerror((int)-len));
            goto done;
        }
        size = (uint64_t)len;
    }
    MeasureOpts m = {.qcow2 = strcmp(out_fmt, "qcow2") == 0};
    if (!m.qcow2 && strcmp(out_fmt, "raw") != 0) {
        if (strcmp(out_fmt, "luks") == 0) {
            qk_tool_error("Parameter 'key-secret' is required for cipher");
        } else if (qemu_format(out_fmt)) {
            qk_tool_error("Block driver '%s' does not support size measurement", out_fmt);
        } else {
            qk_tool_error("Unknown file format '%s'", out_fmt);
        }
        goto done;
    }
    for (int i = 0; i < nlists; i++) {
        if (apply_opt_list(&m, out_fmt, lists[i]) < 0) {
            goto done;
        }
    }
    Result r = {0};
    if (m.qcow2) {
        if (measure_qcow2(&m, in, filename, size, &r) < 0) {
            goto done;
        }
    } else {
        /* A raw image is its virtual size, in whole sectors. */
        r.required = r.fully = div_up(size, 512) * 512;
    }
    print_result(&r, json);
    ret = 0;
done:
    if (in) {
        qk_block_close(in);
    }
    return ret;
}

const QkCommand qk_cmd_measure = {
    .name = "measure",
    .summary = "compute the size a new image needs",
    .usage = usage_text,
    .run = run_measure,
};
