/* The library from many short-lived threads, and with descriptors running
 * out: each thread's event loop is freed when the thread exits (descriptor
 * and thread counts stay flat), and an event loop that cannot be set up is
 * an error from the open call, never an abort. */
#include "qktest.h"
#include "qcowkit/qcowkit.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    int n = 0;
    if (!d) {
        return -1;
    }
    while (readdir(d)) {
        n++;
    }
    closedir(d);
    return n;
}

static void *one_call(void *p)
{
    char msg[256], buf[8192];
    memset(buf, 0x3c, sizeof(buf));
    QkImage *img = qk_image_open(p, "qcow2", QK_IMAGE_RDWR, msg, sizeof(msg));
    long ok = img && qk_image_pwrite(img, 65536, buf, sizeof(buf)) == 0;
    ok = qk_image_close(img) == 0 && ok;
    return (void *)ok;
}

static void *inline_open(void *p)
{
    char msg[256];
    QkAsyncImage *a = qk_async_open(p, "qcow2", QK_ASYNC_INLINE, 1, msg, sizeof(msg));
    long ok = a != NULL && qk_async_close(a) == 0;
    return (void *)ok;
}

/* In a child with a descriptor limit: opens until the limit bites. */
static int exhaust(int limit, bool async)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit rl = {(rlim_t)limit, (rlim_t)limit};
        setrlimit(RLIMIT_NOFILE, &rl);
        char msg[256];
        for (int i = 0; i < 10000; i++) {
            /* A new thread per open needs a new loop each time. */
            void *img = async ? (void *)qk_async_open("t.qcow2", "qcow2", 0, 1, msg, sizeof(msg))
                              : (void *)qk_image_open("t.qcow2", "qcow2", 0, msg, sizeof(msg));
            if (!img) {
                if (!(strstr(msg, "open files") || strstr(msg, "event loop"))) {
                    fprintf(stderr, "limit %d: %s\n", limit, msg);
                    _exit(3);
                }
                _exit(0);
            }
        }
        _exit(2);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(void)
{
    QK_CHECK_EQ(system("qemu-img create -q -f qcow2 t.qcow2 4M"), 0);
    QK_CHECK_EQ(system("qemu-img create -q -f qcow2 u.qcow2 4M"), 0);
    pthread_t t;
    void *ok;
    /* Warm up: the first thread may set up process-wide state. */
    QK_CHECK(pthread_create(&t, NULL, one_call, "t.qcow2") == 0 && pthread_join(t, &ok) == 0 && ok);
    int fds0 = count_dir("/proc/self/fd"), th0 = count_dir("/proc/self/task");
    for (int i = 0; i < 200; i++) {
        QK_CHECK(pthread_create(&t, NULL, (i & 1) ? one_call : inline_open, "t.qcow2") == 0);
        QK_CHECK(pthread_join(t, &ok) == 0 && ok);
    }
    int fds1 = count_dir("/proc/self/fd"), th1 = count_dir("/proc/self/task");
    QK_CHECK(fds1 <= fds0 + 2);
    QK_CHECK(th1 <= th0 + 1);
    if (fds1 > fds0 + 2 || th1 > th0 + 1) {
        fprintf(stderr, "after 200 threads: %d -> %d descriptors, %d -> %d threads\n", fds0, fds1, th0, th1);
    }
    QK_CHECK_EQ(system("qemu-img check -q t.qcow2"), 0);
    /* Out of descriptors: an error from the open, not an abort. */
    for (int limit = 16; limit <= 40; limit += 4) {
        QK_CHECK_EQ(exhaust(limit, false), 0);
        QK_CHECK_EQ(exhaust(limit, true), 0);
    }
    QK_TEST_DONE();
}
