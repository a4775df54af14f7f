/*
 * One-shot events signalled from other threads (see thread_event.h):
 * an eventfd per event in flight, drawn from a small process-wide spare
 * list.
 */
#include "aio/thread_event.h"
#include "aio/aio.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_SPARE_FDS 64
/* A read at this offset uses the descriptor's own position (eventfds
 * have none), see aio.c. */
#define NO_OFFSET UINT64_MAX

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int spare[MAX_SPARE_FDS];
static unsigned nspare;

int qk_thread_event_init(QkThreadEvent *ev)
{
    pthread_mutex_lock(&lock);
    ev->fd = nspare ? spare[--nspare] : -1;
    pthread_mutex_unlock(&lock);
    if (ev->fd < 0) {
        ev->fd = eventfd(0, EFD_CLOEXEC);
    }
    return ev->fd < 0 ? -errno : 0;
}

/* Only descriptors whose counter is known to be 0 come back here. */
static void give_fd(int fd)
{
    pthread_mutex_lock(&lock);
    if (nspare < MAX_SPARE_FDS) {
        spare[nspare++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&lock);
    if (fd >= 0) {
        close(fd);
    }
}

void qk_thread_event_signal(QkThreadEvent *ev)
{
    uint64_t one = 1;
    /* Cannot fail on a valid eventfd short of overflow, which one write
     * per event never reaches. */
    while (write(ev->fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
}

void coroutine_fn qk_co_thread_event_wait(QkThreadEvent *ev)
{
    uint64_t v;
    struct iovec iov = {.iov_base = &v, .iov_len = sizeof(v)};
    ssize_t n;
    do {
        n = qk_co_host_preadv(ev->fd, &iov, 1, NO_OFFSET);
    } while (n == -EINTR || n == -EAGAIN);
    if (n != (ssize_t)sizeof(v)) {
        /* The signal will come: a descriptor in an unknown state is not
         * reused. Wait for it the blocking way. */
        while (read(ev->fd, &v, sizeof(v)) < 0 && errno == EINTR) {
        }
        close(ev->fd);
    } else {
        give_fd(ev->fd);
    }
    ev->fd = -1;
}

void qk_thread_event_destroy(QkThreadEvent *ev)
{
    if (ev->fd >= 0) {
        give_fd(ev->fd);
        ev->fd = -1;
    }
}
