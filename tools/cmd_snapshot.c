/*
 * qcowkit snapshot: list, create, apply and delete internal snapshots the
 * way `qemu-img snapshot` does (same columns, messages and exit codes),
 * plus saving VM state with a snapshot (--vmstate, streamed through the
 * block layer's buffered writer) and writing it back out after applying
 * one (--vmstate-out, read with read-ahead).
 */
#include "cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const usage_text =
    "Usage: qcowkit snapshot [-f FMT] [-U] [-q] [--output=human|json] [-t CACHE]\n"
    "                        [-l | -a SNAPSHOT | -c SNAPSHOT | -d SNAPSHOT] FILE\n"
    "       qcowkit snapshot -c SNAPSHOT --vmstate FILE|- [VM-STATE OPTIONS] IMAGE\n"
    "       qcowkit snapshot -a SNAPSHOT --vmstate-out FILE|- [VM-STATE OPTIONS] IMAGE\n"
    "\n"
    "  -l                 list the snapshots (nothing when there are none)\n"
    "  -c SNAPSHOT        create a snapshot named SNAPSHOT (ids are numbered; a name may repeat)\n"
    "  -a SNAPSHOT        apply (revert to) the snapshot with this id, else the first so named\n"
    "  -d SNAPSHOT        delete the first snapshot named SNAPSHOT (by name only, as qemu-img)\n"
    "  -t CACHE           none, writeback (default), writethrough, directsync, unsafe\n"
    "  --vmstate F        with -c: save the VM state read from F (- is stdin)\n"
    "  --vmstate-out F    with -a: write the snapshot's VM state to F (- is stdout)\n"
    "  --vmstate-workers N      buffers written or read in parallel (default 4)\n"
    "  --vmstate-buf-size SIZE  buffer size (default max(cluster size, 2M))\n"
    "  --vmstate-unbuffered     write each piece as it is read (slow; for comparison)\n";

typedef struct SnapRun {
    QkBlock *bs;
    char op;                     /* 'l', 'c', 'a', 'd' */
    const char *name;
    bool json, quiet;
    const char *vm_in, *vm_out;
    QkVmStateOptions vmo;
    int ret;
} SnapRun;

/* Debug hook for fault tests: QCOWKIT_VMSTATE_FAIL_AT=POS makes every
 * state write reaching stream position POS fail with EIO. */
static uint64_t fail_at = UINT64_MAX;

static int coroutine_fn failing_sink(QkBlock *bs, QkIov *qiov, uint64_t pos)
{
    if (pos + qiov->size > fail_at) {
        return -EIO;
    }
    return qk_co_save_vmstate(bs, qiov, pos);
}

/* Reads up to len bytes, yielding to the loop while a pipe is empty so
 * state writes keep completing. Returns bytes (0 at EOF) or -errno. */
static ssize_t coroutine_fn co_read(int fd, bool pollable, void *buf, size_t len)
{
    for (;;) {
        ssize_t n = read(fd, buf, len);
        if (n >= 0) {
            return n;
        }
        if (errno == EINTR) {
            continue;
        }
        if (errno != EAGAIN || !pollable) {
            return -errno;
        }
        qk_co_wait_fd(fd, POLLIN, -1);
    }
}

static int coroutine_fn write_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno == EAGAIN) {
            qk_co_wait_fd(fd, POLLOUT, -1);
            continue;
        }
        if (n < 0) {
            return -errno;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int open_stream(const char *path, bool out, bool *pollable)
{
    int fd = strcmp(path, "-") == 0 ? (out ? STDOUT_FILENO : STDIN_FILENO)
                                    : open(path, out ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
    struct stat st;
    *pollable = fd >= 0 && fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode));
    if (*pollable) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        /* A 64 KiB pipe costs a wake-up per 64 KiB on both sides; best
         * effort, the limit may be lower for unprivileged users. */
        fcntl(fd, F_SETPIPE_SZ, 1 << 20);
    }
    return fd;
}

static void close_stream(const char *path, int fd, bool pollable)
{
    if (pollable) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    }
    if (strcmp(path, "-") != 0) {
        close(fd);
    }
}

/* Streams the state into the VM-state area; *size gets its length. */
static int coroutine_fn save_state(SnapRun *m, uint64_t *size)
{
    bool pollable;
    int fd = open_stream(m->vm_in, false, &pollable);
    if (fd < 0) {
        qk_tool_error("Could not open '%s': %s", m->vm_in, strerror(errno));
        return -errno;
    }
    QkVmStateWriter *w = qk_vmstate_writer_new(m->bs, &m->vmo, fail_at != UINT64_MAX ? failing_sink : NULL);
    /* Pieces the size QEMU's migration stream hands to the block layer. */
    size_t piece = 131328;
    char *buf = malloc(piece);
    int r = w && buf ? 0 : -ENOMEM;
    uint64_t pos = 0;
    while (r == 0) {
        ssize_t n = co_read(fd, pollable, buf, piece);
        if (n <= 0) {
            r = (int)n;
            if (r < 0) {
                qk_tool_error("Could not read the VM state: %s", strerror(-r));
            }
            break;
        }
        r = qk_vmstate_write(w, pos, buf, (size_t)n);
        pos += (uint64_t)n;
    }
    int fr = w ? qk_vmstate_writer_flush(w) : 0;
    if (r == 0) {
        r = fr;
    }
    qk_vmstate_writer_free(w);
    free(buf);
    close_stream(m->vm_in, fd, pollable);
    *size = pos;
    return r;
}

static int coroutine_fn do_create(SnapRun *m)
{
    QkError err = {0};
    /* qemu-img records an icount of 0 for the snapshots it takes; QEMU's
     * savevm, which a snapshot with VM state stands for, records none
     * (-1) unless it runs record/replay. */
    /* qemu-img keeps the first 255 bytes of a name; -a and -d then find
     * the snapshot by what it keeps, here too. */
    char name[256];
    snprintf(name, sizeof(name), "%s", m->name);
    QkSnapshotInfo info = {.name = name, .icount = m->vm_in ? -1 : 0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    info.date_sec = (uint32_t)ts.tv_sec;
    info.date_nsec = (uint32_t)(ts.tv_nsec / 1000 * 1000);
    int r = 0;
    if (m->vm_in) {
        /* A state left over from an applied snapshot or a failed save must
         * not end up in this one. */
        r = qk_co_vmstate_discard(m->bs, &err);
        if (r == 0) {
            r = save_state(m, &info.vm_state_size);
            if (r < 0) {
                qk_error_set_errno(&err, r, "Could not save the VM state");
            }
        }
    }
    if (r == 0) {
        r = qk_co_snapshot_create(m->bs, &info, &err);
    }
    if (m->vm_in) {
        QkError e2 = {0};
        int dr = qk_co_vmstate_discard(m->bs, &e2);
        if (r == 0 && dr < 0) {
            r = dr;
            err = e2;
        }
    }
    if (r < 0) {
        qk_tool_error("Could not create snapshot '%s': %s", m->name, err.msg);
    }
    return r;
}

/* Writes the applied snapshot's VM state (size bytes) to --vmstate-out. */
static int coroutine_fn load_state(SnapRun *m, uint64_t size)
{
    int r;
    bool pollable;
    int fd = open_stream(m->vm_out, true, &pollable);
    if (fd < 0) {
        qk_tool_error("Could not open '%s': %s", m->vm_out, strerror(errno));
        return -errno;
    }
    QkVmStateReader *rd = qk_vmstate_reader_new(m->bs, size, &m->vmo, NULL);
    size_t chunk = 1 << 20;
    char *buf = malloc(chunk);
    r = rd && buf ? 0 : -ENOMEM;
    for (uint64_t pos = 0; r == 0 && pos < size;) {
        int64_t got = qk_vmstate_read(rd, pos, buf, chunk);
        if (got <= 0) {
            r = got < 0 ? (int)got : -EIO;
            qk_tool_error("Could not read the VM state: %s", strerror(-r));
            break;
        }
        r = write_all(fd, buf, (size_t)got);
        if (r < 0) {
            qk_tool_error("Could not write '%s': %s", m->vm_out, strerror(-r));
        }
        pos += (uint64_t)got;
    }
    qk_vmstate_reader_close(rd);
    free(buf);
    close_stream(m->vm_out, fd, pollable);
    return r;
}

static void coroutine_fn snap_entry(void *opaque)
{
    SnapRun *m = opaque;
    QkError err = {0};
    int r = 0;
    switch (m->op) {
    case 'l': {
        QkSnapshotInfo *l;
        int n;
        r = qk_co_snapshot_list(m->bs, &l, &n, &err);
        if (r == -ENOTSUP) {
            r = 0; /* like qemu-img: a format without snapshots lists none */
            break;
        }
        if (r < 0) {
            qk_tool_error("Could not read the snapshot table: %s", err.msg);
            break;
        }
        if (m->json) {
            json_t *a = qk_tool_snapshots_json(l, n);
            qk_tool_print_json(a);
            json_decref(a);
        } else {
            qk_tool_print_snapshots(l, n);
        }
        qk_snapshot_list_free(l, n);
        break;
    }
    case 'c':
        r = do_create(m);
        break;
    case 'a': {
        uint64_t vm_size;
        r = qk_co_snapshot_goto(m->bs, m->name, &vm_size, &err);
        if (r < 0) {
            qk_tool_error("Could not apply snapshot '%s': %s", m->name, err.msg);
            break;
        }
        if (m->vm_out) {
            r = load_state(m, vm_size);
        }
        /* The applied state was read (or not wanted): the active disk need
         * not keep a hidden copy; the snapshot still has it. */
        if (r == 0) {
            r = qk_co_vmstate_discard(m->bs, &err);
            if (r < 0) {
                qk_tool_error("Could not apply snapshot '%s': %s", m->name, err.msg);
            }
        }
        break;
    }
    case 'd':
        r = qk_co_snapshot_delete(m->bs, NULL, m->name, &err);
        if (r < 0) {
            qk_tool_error("Could not delete snapshot '%s': %s", m->name, err.msg);
        }
        break;
    }
    m->ret = r < 0 ? 1 : 0;
}

static int run(int argc, char **argv)
{
    enum { OPT_OUTPUT = 256, OPT_VMIN, OPT_VMOUT, OPT_WORKERS, OPT_BUFSIZE, OPT_UNBUF };
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"format", required_argument, NULL, 'f'},
        {"output", required_argument, NULL, OPT_OUTPUT},
        {"force-share", no_argument, NULL, 'U'},
        {"vmstate", required_argument, NULL, OPT_VMIN},
        {"vmstate-out", required_argument, NULL, OPT_VMOUT},
        {"vmstate-workers", required_argument, NULL, OPT_WORKERS},
        {"vmstate-buf-size", required_argument, NULL, OPT_BUFSIZE},
        {"vmstate-unbuffered", no_argument, NULL, OPT_UNBUF},
        {NULL, 0, NULL, 0},
    };
    SnapRun m = {0};
    const char *fmt = NULL, *cache = NULL;
    int flags = 0, c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":la:c:d:f:t:qUh", longopts, NULL)) != -1) {
        switch (c) {
        case 'l': case 'a': case 'c': case 'd':
            if (m.op) {
                return qk_tool_bad_usage("snapshot", "Cannot mix '-l', '-a', '-c', '-d'");
            }
            m.op = (char)c;
            m.name = optarg;
            break;
        case 'f': fmt = optarg; break;
        case 't': cache = optarg; break;
        case 'q': m.quiet = true; break;
        case 'U': flags |= QK_OPEN_FORCE_SHARE; break;
        case OPT_OUTPUT:
            if (qk_tool_parse_output("snapshot", optarg, &m.json) < 0) {
                return 1;
            }
            break;
        case OPT_VMIN: m.vm_in = optarg; break;
        case OPT_VMOUT: m.vm_out = optarg; break;
        case OPT_WORKERS:
            m.vmo.workers = atoi(optarg);
            if (m.vmo.workers < 1 || m.vmo.workers > 1024) {
                qk_tool_error("Invalid number of VM-state workers: '%s'", optarg);
                return 1;
            }
            break;
        case OPT_BUFSIZE:
            if (qk_tool_parse_size(optarg, "VM-state buffer size", &m.vmo.buf_size) < 0) {
                return 1;
            }
            if (m.vmo.buf_size == 0 || m.vmo.buf_size > (1ULL << 30)) {
                qk_tool_error("Invalid VM-state buffer size specified: '%s'", optarg);
                return 1;
            }
            break;
        case OPT_UNBUF: m.vmo.unbuffered = true; break;
        case 'h': fputs(usage_text, stdout); return 0;
        case ':': return qk_tool_bad_usage("snapshot", "missing argument for option '%s'", argv[optind - 1]);
        default: return qk_tool_bad_usage("snapshot", "unrecognized option '%s'", argv[optind - 1]);
        }
    }
    if (optind != argc - 1) {
        return qk_tool_bad_usage("snapshot", "Expecting one image file name");
    }
    if (m.vm_in && m.op != 'c') {
        return qk_tool_bad_usage("snapshot", "--vmstate needs -c");
    }
    if (m.vm_out && m.op != 'a') {
        return qk_tool_bad_usage("snapshot", "--vmstate-out needs -a");
    }
    if (m.vm_in && m.vm_out) {
        return qk_tool_bad_usage("snapshot", "--vmstate and --vmstate-out cannot be used together");
    }
    if (m.op && m.op != 'l') {
        flags |= QK_OPEN_RDWR;
    }
    if (cache && qk_cache_mode_parse(cache, &flags) < 0) {
        qk_tool_error("Invalid cache option: %s", cache);
        return 1;
    }
    const char *fa = getenv("QCOWKIT_VMSTATE_FAIL_AT");
    if (fa && qk_tool_size(fa, &fail_at) < 0) {
        fail_at = UINT64_MAX;
    }
    const char *file = argv[optind];
    QkError err = {0};
    m.bs = qk_tool_open(file, fmt, flags, &err);
    if (!m.bs) {
        qk_tool_error("Could not open '%s': %s", file, err.msg);
        return 1;
    }
    QkImageInfo info = {0};
    qk_block_get_info(m.bs, &info);
    m.vmo.cluster_size = info.cluster_size;
    /* Without an action qemu-img opens the image (failing as an open
     * fails) and does nothing more. */
    if (m.op) {
        qk_co_run(snap_entry, &m);
    }
    fflush(stdout);
    int cr = qk_block_close(m.bs);
    if (cr < 0) {
        qk_tool_error("%s: closing the image failed: %s", file, strerror(-cr));
        return 1;
    }
    return m.ret;
}

const QkCommand qk_cmd_snapshot = {
    .name = "snapshot",
    .summary = "list, create, apply or delete internal snapshots (with VM state)",
    .usage = usage_text,
    .run = run,
};
