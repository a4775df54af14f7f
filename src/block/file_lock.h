/*
 * Image locking between processes (file_lock.c), compatible with QEMU's:
 * which permissions a node of a file holds and which it lets others hold.
 */
#ifndef QK_BLOCK_FILE_LOCK_H
#define QK_BLOCK_FILE_LOCK_H

#include "util/error.h"

enum {
    QK_PERM_CONSISTENT_READ = 1u << 0,
    QK_PERM_WRITE = 1u << 1,
    QK_PERM_WRITE_UNCHANGED = 1u << 2,
    QK_PERM_RESIZE = 1u << 3,
    QK_PERM_ALL = 0xfu,
};

typedef struct QkFileLock QkFileLock;

/* Takes PERM on the file open at FD and lets others hold only SHARED.
 * Fails (-EAGAIN, QEMU's message naming FILENAME) when another process
 * holds what we refuse to share or refuses what we take. *OUT is NULL
 * when nothing was locked (file systems without OFD locks). */
int qk_file_lock_acquire(int fd, const char *filename, unsigned perm, unsigned shared, bool take_over,
                         QkFileLock **out, QkError *err);
void qk_file_lock_release(QkFileLock *lock);

#endif
