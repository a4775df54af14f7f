/*
 * Harness plumbing shared by the fuzz targets. See fuzz_common.h.
 */
#include "fuzz_common.h"
#include "aio/loop.h"
#include "block/block.h"

#include <dirent.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

/* Repair may legitimately grow an image; anything past this is a hostile
 * image asking for a huge file, which we let fail. */
#define FUZZ_MAX_FILE (256ull << 20)
#define BASE_SIZE (1u << 20)

void fuzz_init(void)
{
    static int done;
    if (done) {
        return;
    }
    done = 1;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {FUZZ_MAX_FILE, FUZZ_MAX_FILE};
    setrlimit(RLIMIT_FSIZE, &rl);
}

void fuzz_debug(const char *fmt, ...)
{
    static int on = -1;
    if (on < 0) {
        on = getenv("FUZZ_DEBUG") != NULL;
    }
    if (!on) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int fuzz_memfd(const uint8_t *data, size_t len, char *path, size_t pathlen)
{
    int fd = memfd_create("qk-fuzz", MFD_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, data + done, len - done);
        if (n <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)n;
    }
    snprintf(path, pathlen, "/proc/self/fd/%d", fd);
    return fd;
}

static char scratch[64];

const char *fuzz_scratch_dir(void)
{
    if (scratch[0]) {
        return scratch;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(scratch, sizeof(scratch), "%s/qk-fuzz.XXXXXX", tmp && strlen(tmp) < 40 ? tmp : "/tmp");
    if (!mkdtemp(scratch) || chdir(scratch) < 0) {
        scratch[0] = 0;
        return NULL;
    }
    return scratch;
}

void fuzz_scratch_clean(void)
{
    if (!scratch[0]) {
        return;
    }
    DIR *d = opendir(scratch);
    if (!d) {
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            char p[sizeof(scratch) + 300];
            snprintf(p, sizeof(p), "%s/%s", scratch, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

static uint8_t *base;
static size_t base_len;

/* Writes a few patterned clusters so reads and block status see data,
 * zeros and holes. */
static void coroutine_fn fill_base(void *opaque)
{
    QkBlock *bs = opaque;
    uint8_t buf[65536];
    for (int i = 0; i < 4; i++) {
        memset(buf, 0x11 * (i + 1), sizeof(buf));
        qk_co_pwrite(bs, (uint64_t)i * 3 * sizeof(buf), sizeof(buf), buf, 0);
    }
    qk_co_pwrite_zeroes(bs, 2 * sizeof(buf), sizeof(buf), 0);
    qk_co_flush(bs);
}

const uint8_t *fuzz_base_image(size_t *len)
{
    if (base) {
        *len = base_len;
        return base;
    }
    char path[64];
    int fd = fuzz_memfd(NULL, 0, path, sizeof(path));
    if (fd < 0) {
        return NULL;
    }
    QkError err = {0};
    QkCreateOptions co = {.format = "qcow2", .size = BASE_SIZE, .size_set = true};
    QkOpenOptions oo = {.flags = QK_OPEN_RDWR, .format = "qcow2"};
    QkBlock *bs = NULL;
    if (qk_block_create(path, &co, &err) == 0 && (bs = qk_block_open(path, &oo, &err))) {
        qk_co_run(fill_base, bs);
        qk_block_close(bs);
        off_t end = lseek(fd, 0, SEEK_END);
        base = end > 0 ? malloc((size_t)end) : NULL;
        if (base && pread(fd, base, (size_t)end, 0) == end) {
            base_len = (size_t)end;
        } else {
            free(base);
            base = NULL;
        }
    }
    if (!base) {
        fprintf(stderr, "fuzz: could not build the base image: %s\n", err.msg);
    }
    close(fd);
    *len = base_len;
    return base;
}
