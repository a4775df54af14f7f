/*
 * Image locking between processes, in QEMU's byte-range scheme, so that
 * qcowkit and QEMU's tools keep out of each other's way on one image.
 *
 * Four permissions (bit i: consistent read, write, write unchanged,
 * resize). A user that holds permission i takes a shared OFD lock on byte
 * 100 + i of the file; one that does not let others hold it takes a shared
 * lock on byte 200 + i. Holding i conflicts with anyone's lock on 200 + i,
 * refusing to share it with anyone's lock on 100 + i: tested with F_OFD_GETLK
 * after taking our own bytes, so of two users opening at once at least one
 * sees the other.
 *
 * Within the process the nodes of one file share a single lock descriptor
 * (an OFD's own locks never conflict with it), so two nodes of one file in
 * one process (a chain's read-only base and commit's writable node of it)
 * do not refuse each other: their combined needs are what others see.
 * File systems without OFD locks go unlocked, as QEMU's locking=auto does.
 */
#include "block/file_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { PERM_BASE = 100, SHARED_BASE = 200, NPERM = 4 };

static const char *const perm_names[NPERM] = {"consistent read", "write", "write unchanged", "resize"};

/* One locked file: every node of it in this process. */
typedef struct LockedFile {
    dev_t dev;
    ino_t ino;
    int fd;                     /* the one lock descriptor of this file */
    unsigned refs;
    unsigned held[NPERM];       /* users holding permission i */
    unsigned unshared[NPERM];   /* users not sharing permission i */
    unsigned locked;            /* bytes locked: bit i = 100 + i, bit 4 + i = 200 + i */
    unsigned excl_writers;      /* nodes of this process writing and sharing no write */
    struct LockedFile *next;
} LockedFile;

/* One node's share of a LockedFile. */
struct QkFileLock {
    LockedFile *file;
    unsigned perm, unshared;
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static LockedFile *registry;

static int lock_byte(int fd, int byte, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

/* Does anyone else hold a lock on byte? (our own OFD's never count) */
static int someone_holds(int fd, int byte)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
    if (fcntl(fd, F_OFD_GETLK, &fl) < 0) {
        return -errno;
    }
    return fl.l_type != F_UNLCK;
}

static unsigned wanted_bytes(const LockedFile *l)
{
    unsigned m = 0;
    for (int i = 0; i < NPERM; i++) {
        m |= (l->held[i] ? 1u << i : 0) | (l->unshared[i] ? 1u << (NPERM + i) : 0);
    }
    return m;
}

static int byte_of(int bit)
{
    return bit < NPERM ? PERM_BASE + bit : SHARED_BASE + bit - NPERM;
}

/* Makes the locked bytes what the users need: takes the new, drops the rest. */
static int sync_bytes(LockedFile *l)
{
    unsigned want = wanted_bytes(l);
    for (int b = 0; b < 2 * NPERM; b++) {
        unsigned bit = 1u << b;
        if ((want & bit) && !(l->locked & bit)) {
            int r = lock_byte(l->fd, byte_of(b), F_RDLCK);
            if (r < 0) {
                return r;
            }
            l->locked |= bit;
        } else if (!(want & bit) && (l->locked & bit)) {
            lock_byte(l->fd, byte_of(b), F_UNLCK);
            l->locked &= ~bit;
        }
    }
    return 0;
}

static void count(LockedFile *l, unsigned perm, unsigned unshared, int d)
{
    for (int i = 0; i < NPERM; i++) {
        if (perm & (1u << i)) {
            l->held[i] += (unsigned)d;
        }
        if (unshared & (1u << i)) {
            l->unshared[i] += (unsigned)d;
        }
    }
}

static void release(LockedFile *l)
{
    if (--l->refs) {
        return;
    }
    for (LockedFile **p = &registry; *p; p = &(*p)->next) {
        if (*p == l) {
            *p = l->next;
            break;
        }
    }
    close(l->fd); /* drops every lock it held */
    free(l);
}

static bool unsupported(int r)
{
    return r == -EINVAL || r == -ENOLCK || r == -EOPNOTSUPP || r == -ENOSYS;
}

int qk_file_lock_acquire(int fd, const char *filename, unsigned perm, unsigned shared, bool take_over,
                         QkFileLock **out, QkError *err)
{
    *out = NULL;
    unsigned unshared = ~shared & QK_PERM_ALL;
    perm &= QK_PERM_ALL;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        return 0;
    }
    pthread_mutex_lock(&registry_lock);
    LockedFile *l = registry;
    while (l && !(l->dev == st.st_dev && l->ino == st.st_ino)) {
        l = l->next;
    }
    if (!l) {
        l = calloc(1, sizeof(*l));
        char path[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        /* Non-blocking: reopening a FIFO read-only would wait for a writer. */
        int lfd = l ? open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC) : -1;
        if (lfd < 0) {
            /* Nothing to lock with (no /proc, or not readable): unlocked. */
            free(l);
            pthread_mutex_unlock(&registry_lock);
            return 0;
        }
        *l = (LockedFile){.dev = st.st_dev, .ino = st.st_ino, .fd = lfd, .next = registry};
        registry = l;
    }
    /* Within the process, QEMU's permission rules: a writer needs every
     * other node to share writes, and a node that shares none needs no
     * other to write. Two qcow2 writers would each keep metadata of their
     * own and overwrite each other's; a reader after a writer would read
     * tables not yet written back. A writer after readers that share no
     * writes is allowed only when it says they never read what it writes
     * (take_over: commit's base under the chain). -U reads knowingly. */
    bool writes = perm & QK_PERM_WRITE;
    bool excl = writes && !(shared & QK_PERM_WRITE);
    const char *why = NULL;
    if (writes && (l->excl_writers || (l->unshared[1] && !take_over))) {
        why = l->excl_writers ? "already open read-write" : "already open by a reader that shares no writes";
    } else if (!(shared & QK_PERM_WRITE) && l->held[1]) {
        why = "already open read-write";
    }
    if (why) {
        pthread_mutex_unlock(&registry_lock); /* (the other node holds l: it stays) */
        return qk_error_set(err, -EBUSY, "Failed to get %s\"write\" lock\nThe image is %s in this process [%s]",
                            writes ? "" : "shared ", why, filename);
    }
    l->refs++;
    l->excl_writers += excl;
    count(l, perm, unshared, 1);
    int r = sync_bytes(l);
    if (unsupported(r)) {
        count(l, perm, unshared, -1);
        l->excl_writers -= excl;
        sync_bytes(l);
        release(l);
        pthread_mutex_unlock(&registry_lock);
        return 0;
    }
    const char *what = NULL;
    bool shared_lock = false;
    for (int i = 0; r == 0 && !what && i < NPERM; i++) {
        int h = (perm & (1u << i)) ? someone_holds(l->fd, SHARED_BASE + i) : 0;
        if (h > 0) {
            what = perm_names[i];
        } else if (h < 0) {
            r = h;
        }
    }
    for (int i = 0; r == 0 && !what && i < NPERM; i++) {
        int h = (unshared & (1u << i)) ? someone_holds(l->fd, PERM_BASE + i) : 0;
        if (h > 0) {
            what = perm_names[i];
            shared_lock = true;
        } else if (h < 0) {
            r = h;
        }
    }
    if (r < 0 || what) {
        count(l, perm, unshared, -1);
        l->excl_writers -= excl;
        sync_bytes(l);
        release(l);
        pthread_mutex_unlock(&registry_lock);
        if (what) {
            return qk_error_set(err, -EAGAIN, "Failed to get %s\"%s\" lock\nIs another process using the image [%s]?",
                                shared_lock ? "shared " : "", what, filename);
        }
        return qk_error_set_errno(err, r, "Failed to lock '%s'", filename);
    }
    pthread_mutex_unlock(&registry_lock);
    QkFileLock *u = malloc(sizeof(*u));
    if (!u) {
        /* Keep the locks (the safe side) without a way to give them back. */
        return 0;
    }
    *u = (QkFileLock){.file = l, .perm = perm, .unshared = unshared};
    *out = u;
    return 0;
}

void qk_file_lock_release(QkFileLock *u)
{
    if (!u) {
        return;
    }
    pthread_mutex_lock(&registry_lock);
    count(u->file, u->perm, u->unshared, -1);
    u->file->excl_writers -= (u->perm & QK_PERM_WRITE) && (u->unshared & QK_PERM_WRITE);
    sync_bytes(u->file);
    release(u->file);
    pthread_mutex_unlock(&registry_lock);
    free(u);
}
