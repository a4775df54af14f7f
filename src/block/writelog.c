/*
 * The write log (see writelog.h for the format and what it means). One log
 * file per process, opened on first use with O_APPEND so that processes run
 * one after another (create, io, snapshot...) extend the same log. A mutex
 * keeps seq order and file order the same if several threads log.
 */
#include "block/writelog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct QkWriteLog {
    uint32_t file;
};

typedef struct __attribute__((packed)) Header {
    uint32_t magic;
    uint16_t type;
    uint16_t flags;
    uint32_t file;
    uint32_t pid;
    uint64_t seq;
    uint64_t off;
    uint64_t len;
} Header;

_Static_assert(sizeof(Header) == 40, "log header is 40 bytes");

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static int log_error;          /* sticky: once the log failed, it stays failed */
static uint64_t next_seq = 1;
static uint32_t next_file = 1;
static int64_t next_flush = 1;

/* Called with lock held. Returns 0 (fd open), 1 (logging off) or -errno.
 * The variable is read at every open, so files opened while it is unset
 * are not logged; the log file itself is the one it named first. */
static int open_log_locked(void)
{
    const char *path = getenv(QK_WRITE_LOG_ENV);
    if (!path || !*path) {
        return 1;
    }
    if (log_fd >= 0) {
        return 0;
    }
    if (log_error) {
        return log_error;
    }
    log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (log_fd < 0) {
        log_error = -errno;
        return log_error;
    }
    return 0;
}

/* Writes header + payload as one append so records never interleave,
 * even between processes sharing the log. Called with lock held. */
static int append_locked(Header *h, const struct iovec *payload, int npayload)
{
    if (log_error) {
        return log_error;
    }
    if (npayload > 62) {
        return -EINVAL; /* callers pass at most the iov of one request */
    }
    struct iovec v[64];
    h->magic = QK_WRITE_LOG_MAGIC;
    h->pid = (uint32_t)getpid();
    h->seq = next_seq++;
    v[0] = (struct iovec){.iov_base = h, .iov_len = sizeof(*h)};
    size_t total = sizeof(*h);
    for (int i = 0; i < npayload; i++) {
        v[i + 1] = payload[i];
        total += payload[i].iov_len;
    }
    ssize_t n = writev(log_fd, v, npayload + 1);
    if (n < 0 || (size_t)n != total) {
        /* A short append leaves a torn record; the replay stops there. */
        log_error = n < 0 ? -errno : -EIO;
        return log_error;
    }
    return 0;
}

int qk_write_log_attach(const char *filename, QkWriteLog **out, QkError *err)
{
    *out = NULL;
    pthread_mutex_lock(&lock);
    int r = open_log_locked();
    if (r == 1) {
        pthread_mutex_unlock(&lock);
        return 0;
    }
    QkWriteLog *l = NULL;
    if (r == 0) {
        l = calloc(1, sizeof(*l));
        r = l ? 0 : -ENOMEM;
    }
    if (r == 0) {
        char *real = realpath(filename, NULL);
        const char *name = real ? real : filename;
        l->file = next_file++;
        Header h = {.type = QK_WLOG_OPEN, .file = l->file, .len = strlen(name)};
        struct iovec p = {.iov_base = (void *)name, .iov_len = h.len};
        r = append_locked(&h, &p, 1);
        free(real);
    }
    pthread_mutex_unlock(&lock);
    if (r < 0) {
        free(l);
        return qk_error_set_errno(err, r, "Could not write the log named by %s", QK_WRITE_LOG_ENV);
    }
    *out = l;
    return 0;
}

void qk_write_log_detach(QkWriteLog *l)
{
    free(l);
}

int qk_write_log_data(QkWriteLog *l, uint64_t off, const struct iovec *iov, int niov, uint64_t bytes)
{
    Header h = {.type = QK_WLOG_WRITE, .file = l->file, .off = off, .len = bytes};
    char *flat = NULL;
    struct iovec one;
    if (niov > 62) {
        /* Rare (long scatter lists): gather so the record stays one append. */
        flat = malloc(bytes ? bytes : 1);
        if (!flat) {
            return -ENOMEM;
        }
        size_t done = 0;
        for (int i = 0; i < niov && done < bytes; i++) {
            size_t n = iov[i].iov_len < bytes - done ? iov[i].iov_len : bytes - done;
            memcpy(flat + done, iov[i].iov_base, n);
            done += n;
        }
        one = (struct iovec){.iov_base = flat, .iov_len = bytes};
        iov = &one;
        niov = 1;
    }
    pthread_mutex_lock(&lock);
    int r = append_locked(&h, iov, niov);
    pthread_mutex_unlock(&lock);
    free(flat);
    return r;
}

int qk_write_log_op(QkWriteLog *l, QkWriteLogType type, int flags, uint64_t off, uint64_t len)
{
    Header h = {.type = (uint16_t)type, .flags = (uint16_t)flags, .file = l->file, .off = off, .len = len};
    pthread_mutex_lock(&lock);
    int r = append_locked(&h, NULL, 0);
    pthread_mutex_unlock(&lock);
    return r;
}

int64_t qk_write_log_flush_begin(QkWriteLog *l, int flags)
{
    pthread_mutex_lock(&lock);
    int64_t id = next_flush++;
    Header h = {.type = QK_WLOG_FLUSH_BEGIN, .flags = (uint16_t)flags, .file = l->file, .off = (uint64_t)id};
    int r = append_locked(&h, NULL, 0);
    pthread_mutex_unlock(&lock);
    return r < 0 ? r : id;
}

int qk_write_log_flush_end(QkWriteLog *l, int64_t id, int result)
{
    Header h = {.type = QK_WLOG_FLUSH_END, .file = l->file, .off = (uint64_t)id,
                .len = (uint64_t)(int64_t)result};
    pthread_mutex_lock(&lock);
    int r = append_locked(&h, NULL, 0);
    pthread_mutex_unlock(&lock);
    return r;
}

int qk_write_log_mark(const char *text)
{
    pthread_mutex_lock(&lock);
    int r = open_log_locked();
    if (r == 0) {
        Header h = {.type = QK_WLOG_MARK, .len = strlen(text)};
        struct iovec p = {.iov_base = (void *)text, .iov_len = h.len};
        r = append_locked(&h, &p, 1);
    }
    pthread_mutex_unlock(&lock);
    return r == 1 ? 0 : r;
}
