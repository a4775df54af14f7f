/*
 * The per-thread event loop. One iteration: run callbacks and woken
 * coroutines, fire due timers, push queued I/O to the backend, reap
 * completions, then block (in the backend itself when it is the only event
 * source, else in epoll) until something happens.
 *
 * Owns: wake lists, timers, fd readiness waits, backend selection.
 */
#include "aio/loop.h"
#include "aio/backend.h"
#include "util/tunables.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

typedef struct Callback {
    QkCallback *cb;
    void *opaque;
    struct Callback *next;
} Callback;

typedef struct Timer {
    int64_t deadline;
    QkCallback *cb;
    void *opaque;
    struct Timer *next;
} Timer;

typedef struct FdWait {
    int fd;
    int registered;        /* epoll events currently registered */
    QkCoroutine *reader, *writer;
    int rresult, wresult;
} FdWait;

struct QkLoop {
    QkAioBackend ops;
    void *backend;
    QkAioBackend bg_ops;    /* background coroutines' I/O, made on first use */
    void *bg;
    int epfd;
    QkCoroutine *wake_head, *wake_tail;
    Callback *cb_head, *cb_tail;
    Timer *timers;          /* sorted by deadline */
    FdWait **fds;           /* indexed by fd */
    int nfds_alloc;
    unsigned fd_waiters;
    unsigned reap_batch;    /* completions per look at the fds (0: all) */
    unsigned pins;          /* users that keep a pointer to it (qk_loop_pin) */
};

/* Read by every thread that makes a loop, set by the program (or from
 * QCOWKIT_AIO once): atomic, so engine threads of the async API may start
 * loops while another thread sets it. */
static int backend_choice = QK_AIO_DEFAULT;

static void set_choice(QkAioBackendKind kind)
{
    __atomic_store_n(&backend_choice, (int)kind, __ATOMIC_RELAXED);
}

static QkAioBackendKind get_choice(void)
{
    return (QkAioBackendKind)__atomic_load_n(&backend_choice, __ATOMIC_RELAXED);
}
static __thread QkLoop *thread_loop;

/* A thread's loop is freed when the thread exits, if nothing still needs
 * it: otherwise every short-lived thread that did one sync call would
 * keep its ring, eventfd, epoll descriptor and worker threads forever. */
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static bool loop_idle(QkLoop *loop)
{
    if (loop->wake_head || loop->cb_head || loop->timers || loop->fd_waiters || loop->pins) {
        return false;
    }
    /* Pushes nothing (nothing is queued between calls) and tells what is
     * still in flight: a VM-state stream's writes may be. */
    return loop->ops.submit(loop->backend) == 0 && (!loop->bg || loop->bg_ops.submit(loop->bg) == 0);
}

static void thread_exit(void *p)
{
    if (p && thread_loop == p && loop_idle(thread_loop)) {
        qk_loop_destroy_current();
    }
}

static void exit_key_init(void)
{
    if (pthread_key_create(&exit_key, thread_exit) != 0) {
        exit_key = (pthread_key_t)-1;
    }
}

void qk_loop_pin(QkLoop *loop)
{
    loop->pins++;
}

void qk_loop_unpin(QkLoop *loop)
{
    loop->pins--;
}

void qk_aio_set_backend(QkAioBackendKind kind)
{
    set_choice(kind);
}

int qk_aio_set_backend_name(const char *name)
{
    if (strcmp(name, "io_uring") == 0) {
        set_choice(QK_AIO_IO_URING);
    } else if (strcmp(name, "threads") == 0) {
        set_choice(QK_AIO_THREADS);
    } else if (strcmp(name, "native") == 0 || strcmp(name, "default") == 0) {
        set_choice(QK_AIO_DEFAULT);
    } else {
        return -EINVAL;
    }
    return 0;
}

const char *qk_loop_backend_name(QkLoop *loop)
{
    return loop->ops.name;
}

int64_t qk_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void epoll_add(QkLoop *loop, int fd, void *ptr)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = ptr};
    epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev);
}

int qk_loop_try_get(QkLoop **out)
{
    if (thread_loop) {
        *out = thread_loop;
        return 0;
    }
    QkLoop *loop = calloc(1, sizeof(*loop));
    if (!loop) {
        return -ENOMEM;
    }
    loop->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (loop->epfd < 0) {
        int e = errno;
        free(loop);
        return -e;
    }
    int err = 0;
    /* QCOWKIT_AIO lets tests run every program on both backends. */
    const char *env = getenv("QCOWKIT_AIO");
    if (get_choice() == QK_AIO_DEFAULT && env && *env) {
        qk_aio_set_backend_name(env);
    }
    if (get_choice() != QK_AIO_THREADS) {
        /* Unavailable (an old kernel, a seccomp filter): the thread pool
         * serves instead, silently; qk_loop_backend_name() tells which. */
        loop->backend = qk_uring_backend_new(&loop->ops, &err);
    }
    if (!loop->backend) {
        loop->backend = qk_threads_backend_new(&loop->ops, &err);
        if (!loop->backend) {
            /* Neither backend could start: out of descriptors, memory or
             * threads. Nothing was queued yet, so this is an error to
             * report, not a state to abort in. */
            close(loop->epfd);
            free(loop);
            return err ? -err : -EAGAIN;
        }
    }
    /* NULL data marks the backend's completion fd. */
    epoll_add(loop, loop->ops.event_fd, NULL);
    loop->reap_batch = (unsigned)qk_tunable(QK_TUNE_LOOP_REAP_BATCH);
    thread_loop = loop;
    pthread_once(&exit_key_once, exit_key_init);
    if (exit_key != (pthread_key_t)-1) {
        pthread_setspecific(exit_key, loop);
    }
    *out = loop;
    return 0;
}

QkLoop *qk_loop_get(void)
{
    QkLoop *loop;
    if (qk_loop_try_get(&loop) < 0) {
        abort(); /* callers that can report it use qk_loop_try_get first (see qcowkit.h) */
    }
    return loop;
}

void qk_loop_destroy_current(void)
{
    QkLoop *loop = thread_loop;
    if (!loop) {
        return;
    }
    loop->ops.destroy(loop->backend);
    if (loop->bg) {
        loop->bg_ops.destroy(loop->bg);
    }
    close(loop->epfd);
    for (int i = 0; i < loop->nfds_alloc; i++) {
        free(loop->fds[i]);
    }
    free(loop->fds);
    while (loop->timers) {
        Timer *t = loop->timers;
        loop->timers = t->next;
        free(t);
    }
    free(loop);
    thread_loop = NULL;
    if (exit_key != (pthread_key_t)-1) {
        pthread_setspecific(exit_key, NULL);
    }
    qk_coroutine_pool_drain();
}

void qk_loop_schedule_co(QkLoop *loop, QkCoroutine *co)
{
    *qk_coroutine_wake_next(co) = NULL;
    if (loop->wake_tail) {
        *qk_coroutine_wake_next(loop->wake_tail) = co;
    } else {
        loop->wake_head = co;
    }
    loop->wake_tail = co;
}

void qk_loop_call_soon(QkLoop *loop, QkCallback *cb, void *opaque)
{
    Callback *c = malloc(sizeof(*c));
    if (!c) {
        abort();
    }
    c->cb = cb;
    c->opaque = opaque;
    c->next = NULL;
    if (loop->cb_tail) {
        loop->cb_tail->next = c;
    } else {
        loop->cb_head = c;
    }
    loop->cb_tail = c;
}

void qk_aio_complete(QkAioReq *req, int64_t result)
{
    req->result = result;
    qk_coroutine_enter(req->co);
}

/* ---- timers ---- */

static Timer *timer_add(QkLoop *loop, int64_t deadline, QkCallback *cb, void *opaque)
{
    Timer *t = malloc(sizeof(*t));
    if (!t) {
        abort();
    }
    t->deadline = deadline;
    t->cb = cb;
    t->opaque = opaque;
    Timer **pp = &loop->timers;
    while (*pp && (*pp)->deadline <= deadline) {
        pp = &(*pp)->next;
    }
    t->next = *pp;
    *pp = t;
    return t;
}

static void timer_del(QkLoop *loop, Timer *t)
{
    for (Timer **pp = &loop->timers; *pp; pp = &(*pp)->next) {
        if (*pp == t) {
            *pp = t->next;
            free(t);
            return;
        }
    }
}

static bool run_timers(QkLoop *loop)
{
    bool any = false;
    int64_t now = qk_clock_ns();
    while (loop->timers && loop->timers->deadline <= now) {
        Timer *t = loop->timers;
        loop->timers = t->next;
        QkCallback *cb = t->cb;
        void *opaque = t->opaque;
        free(t);
        cb(opaque);
        any = true;
    }
    return any;
}

static void wake_cb(void *opaque)
{
    qk_coroutine_wake(opaque);
}

void coroutine_fn qk_co_sleep_ns(int64_t ns)
{
    QkLoop *loop = qk_loop_get();
    timer_add(loop, qk_clock_ns() + (ns > 0 ? ns : 0), wake_cb, qk_coroutine_self());
    qk_coroutine_yield();
}

/* ---- fd waits ---- */

static FdWait *fdwait_get(QkLoop *loop, int fd)
{
    if (fd >= loop->nfds_alloc) {
        int n = fd * 2 + 16;
        FdWait **nf = realloc(loop->fds, sizeof(*nf) * n);
        if (!nf) {
            abort();
        }
        memset(nf + loop->nfds_alloc, 0, sizeof(*nf) * (n - loop->nfds_alloc));
        loop->fds = nf;
        loop->nfds_alloc = n;
    }
    if (!loop->fds[fd]) {
        loop->fds[fd] = calloc(1, sizeof(FdWait));
        if (!loop->fds[fd]) {
            abort();
        }
        loop->fds[fd]->fd = fd;
    }
    return loop->fds[fd];
}

static void fdwait_update(QkLoop *loop, FdWait *w)
{
    int want = (w->reader ? EPOLLIN : 0) | (w->writer ? EPOLLOUT : 0);
    if (want == w->registered) {
        return;
    }
    struct epoll_event ev = {.events = (uint32_t)want, .data.ptr = w};
    if (!want) {
        epoll_ctl(loop->epfd, EPOLL_CTL_DEL, w->fd, &ev);
    } else if (!w->registered) {
        if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, w->fd, &ev) < 0 && errno == EEXIST) {
            epoll_ctl(loop->epfd, EPOLL_CTL_MOD, w->fd, &ev);
        }
    } else {
        epoll_ctl(loop->epfd, EPOLL_CTL_MOD, w->fd, &ev);
    }
    w->registered = want;
}

typedef struct FdTimeout {
    QkLoop *loop;
    FdWait *w;
    bool write;
} FdTimeout;

static void fd_finish(QkLoop *loop, FdWait *w, bool write, int result)
{
    QkCoroutine *co = write ? w->writer : w->reader;
    if (!co) {
        return;
    }
    if (write) {
        w->writer = NULL;
        w->wresult = result;
    } else {
        w->reader = NULL;
        w->rresult = result;
    }
    loop->fd_waiters--;
    fdwait_update(loop, w);
    qk_coroutine_wake(co);
}

static void fd_timeout_cb(void *opaque)
{
    FdTimeout *ft = opaque;
    fd_finish(ft->loop, ft->w, ft->write, -ETIMEDOUT);
}

int coroutine_fn qk_co_wait_fd(int fd, int events, int64_t timeout_ns)
{
    QkLoop *loop = qk_loop_get();
    FdWait *w = fdwait_get(loop, fd);
    bool write = (events & POLLOUT) != 0;
    QkCoroutine *self = qk_coroutine_self();
    if (write ? w->writer : w->reader) {
        return -EBUSY;
    }
    if (write) {
        w->writer = self;
    } else {
        w->reader = self;
    }
    loop->fd_waiters++;
    fdwait_update(loop, w);
    FdTimeout ft = {loop, w, write};
    Timer *t = timeout_ns >= 0 ? timer_add(loop, qk_clock_ns() + timeout_ns, fd_timeout_cb, &ft) : NULL;
    qk_coroutine_yield();
    int result = write ? w->wresult : w->rresult;
    if (t && result != -ETIMEDOUT) {
        timer_del(loop, t);
    }
    return result;
}

void qk_loop_cancel_fd_wait(QkLoop *loop, int fd)
{
    if (fd < loop->nfds_alloc && loop->fds[fd]) {
        fd_finish(loop, loop->fds[fd], false, -ECANCELED);
        fd_finish(loop, loop->fds[fd], true, -ECANCELED);
    }
}

/* ---- the loop ---- */

/* How many completions one reap may run. A completion usually runs its
 * coroutine to the next request or reply, so reaping a whole burst runs
 * all of them before the loop looks at its descriptors again: an NBD
 * server then answered 32 requests before it read any of the new ones
 * waiting on its socket, and client, server and disk took turns in waves
 * of the whole queue depth (traced: the disk held 16 of 32 requests).
 * With a coroutine waiting on a descriptor the loop reaps in batches and
 * polls the descriptors between them; otherwise nothing waits, and one
 * reap takes everything. */
static unsigned reap_max(QkLoop *loop)
{
    return loop->fd_waiters ? loop->reap_batch : 0;
}

static bool run_ready(QkLoop *loop)
{
    bool any = false;
    /* Take the current lists; work queued while running goes to the next round
     * so a coroutine that keeps waking itself cannot starve I/O. */
    Callback *cbs = loop->cb_head;
    loop->cb_head = loop->cb_tail = NULL;
    while (cbs) {
        Callback *c = cbs;
        cbs = c->next;
        c->cb(c->opaque);
        free(c);
        any = true;
    }
    QkCoroutine *co = loop->wake_head;
    loop->wake_head = loop->wake_tail = NULL;
    while (co) {
        QkCoroutine *next = *qk_coroutine_wake_next(co);
        qk_coroutine_run_scheduled(co);
        co = next;
        any = true;
    }
    return any;
}

static void handle_epoll(QkLoop *loop, int timeout_ms)
{
    struct epoll_event evs[64];
    int n = epoll_wait(loop->epfd, evs, 64, timeout_ms);
    for (int i = 0; i < n; i++) {
        FdWait *w = evs[i].data.ptr;
        if (!w) {
            continue; /* backend completions: reaped below */
        }
        uint32_t e = evs[i].events;
        if (e & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
            fd_finish(loop, w, false, POLLIN);
        }
        if (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
            fd_finish(loop, w, true, POLLOUT);
        }
    }
}

/* Nothing is runnable and the backend is the only event source: the
 * requests queued in this iteration go in with the wait for completions,
 * one system call (see QkAioBackend.submit_wait). The loop then blocks
 * even when coroutines ran in this iteration, but only until a completion
 * or a timer: one of those is what they wait for.
 * Returns true when it made progress: it waited, or a reap before the
 * wait completed requests. A reap runs the waiting coroutines to their
 * next yield, so it may have finished what the caller waits for; the
 * iteration must end there, not go on to block with nothing in flight. */
static bool try_submit_wait(QkLoop *loop)
{
    if (!loop->ops.submit_wait || loop->fd_waiters || loop->wake_head || loop->cb_head) {
        return false;
    }
    unsigned bg_in_flight = 0;
    if (loop->bg) {
        bg_in_flight = loop->bg_ops.submit(loop->bg);
        if (loop->bg_ops.reap(loop->bg, 0)) {
            return true;
        }
    }
    if (loop->ops.reap(loop->backend, reap_max(loop))) {
        return true;
    }
    if (bg_in_flight || loop->wake_head || loop->cb_head) {
        return false;
    }
    int64_t timeout_ns = -1;
    if (loop->timers) {
        timeout_ns = loop->timers->deadline - qk_clock_ns();
        if (timeout_ns <= 0) {
            return false;
        }
    }
    if (!loop->ops.submit_wait(loop->backend, timeout_ns)) {
        return false; /* nothing in flight: it did not wait; the usual path blocks */
    }
    loop->ops.reap(loop->backend, reap_max(loop));
    return true;
}

/* One iteration. done, when not NULL, is the caller's condition (see
 * qk_loop_run_until). */
static bool run_once(QkLoop *loop, bool blocking, const bool *done)
{
    bool any = run_ready(loop);
    any |= run_timers(loop);
    /* Submit and wait in one call, but never once what ran may have
     * finished what the caller waits for while a request stays in flight
     * for long (a driver's completion reader): then the usual path below
     * submits without waiting. A caller that says what it waits for keeps
     * the single call whenever that is still to come. */
    if (blocking && (done ? !*done : !any) && try_submit_wait(loop)) {
        return true;
    }
    unsigned in_flight = loop->ops.submit(loop->backend);
    if (loop->ops.reap(loop->backend, reap_max(loop))) {
        any = true;
    }
    unsigned bg_in_flight = 0;
    if (loop->bg) {
        bg_in_flight = loop->bg_ops.submit(loop->bg);
        if (loop->bg_ops.reap(loop->bg, 0)) {
            any = true;
        }
    }
    if (any || loop->wake_head || loop->cb_head) {
        if (loop->fd_waiters) {
            handle_epoll(loop, 0);
        }
        return true;
    }
    if (!blocking) {
        if (loop->fd_waiters) {
            handle_epoll(loop, 0);
        }
        return false;
    }
    int64_t timeout_ns = -1;
    if (loop->timers) {
        timeout_ns = loop->timers->deadline - qk_clock_ns();
        if (timeout_ns < 0) {
            timeout_ns = 0;
        }
    }
    if (!loop->fd_waiters && loop->ops.wait && in_flight && !bg_in_flight) {
        loop->ops.wait(loop->backend, timeout_ns);
    } else {
        int ms = timeout_ns < 0 ? -1 : (int)((timeout_ns + 999999) / 1000000);
        handle_epoll(loop, ms);
    }
    loop->ops.reap(loop->backend, reap_max(loop));
    if (loop->bg) {
        loop->bg_ops.reap(loop->bg, 0);
    }
    return true;
}

int qk_loop_poll_fd(QkLoop *loop)
{
    return loop->epfd;
}

int64_t qk_loop_next_timer_ns(QkLoop *loop)
{
    if (!loop->timers) {
        return -1;
    }
    int64_t left = loop->timers->deadline - qk_clock_ns();
    return left > 0 ? left : 0;
}

bool qk_loop_run_once(QkLoop *loop, bool blocking)
{
    return run_once(loop, blocking, NULL);
}

void qk_loop_run_until(QkLoop *loop, const bool *done)
{
    while (!*done) {
        run_once(loop, true, done);
    }
}

typedef struct CoRun {
    QkCoroutineEntry *entry;
    void *opaque;
    bool done;
} CoRun;

static void coroutine_fn co_run_entry(void *opaque)
{
    CoRun *r = opaque;
    r->entry(r->opaque);
    r->done = true;
}

void qk_co_run(QkCoroutineEntry *entry, void *opaque)
{
    QkLoop *loop = qk_loop_get();
    CoRun r = {entry, opaque, false};
    qk_coroutine_enter(qk_coroutine_create(co_run_entry, &r));
    qk_loop_run_until(loop, &r.done);
}

/* Called by aio.c: hands a request to this thread's backend. */
void qk_loop_queue_aio(QkAioReq *req)
{
    QkLoop *loop = qk_loop_get();
    if (qk_coroutine_is_background()) {
        if (!loop->bg) {
            int err = 0;
            loop->bg = qk_threads_backend_new_background(&loop->bg_ops, &err);
            if (loop->bg) {
                epoll_add(loop, loop->bg_ops.event_fd, NULL);
            }
        }
        if (loop->bg) {
            loop->bg_ops.queue(loop->bg, req);
            return;
        }
        /* No pool for it: run it like any other request. */
    }
    loop->ops.queue(loop->backend, req);
}
