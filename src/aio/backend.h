/*
 * Internal interface between the event loop and its I/O backends.
 * A backend queues requests, pushes them to the kernel (or its workers) in a
 * batch once per loop iteration, and completes them by setting req->result
 * and entering req->co.
 */
#ifndef QK_AIO_BACKEND_H
#define QK_AIO_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "aio/aio.h"

typedef struct QkAioBackend {
    const char *name;
    void (*queue)(void *st, QkAioReq *req);
    /* Pushes queued requests; returns how many are in flight afterwards. */
    unsigned (*submit)(void *st);
    /* Completes what finished, at most max requests (0: all), without
     * blocking; returns the count. 0 means nothing was ready: requests
     * left over by max are reaped by the next call, never lost to it. */
    unsigned (*reap)(void *st, unsigned max);
    /* Blocks until a completion or timeout_ns (<0 forever) when this
     * backend is the only event source; NULL if it cannot. */
    void (*wait)(void *st, int64_t timeout_ns);
    /* Pushes queued requests and blocks as wait does, in one system call
     * where the backend can (else NULL): what the loop does when nothing
     * is runnable, so a request a coroutine just queued costs one trip
     * into the kernel rather than two. Waits only with something in
     * flight; returns how many are in flight afterwards. */
    unsigned (*submit_wait)(void *st, int64_t timeout_ns);
    void (*destroy)(void *st);
    int event_fd; /* readable in epoll when completions are ready */
} QkAioBackend;

/* Request lists linked through next, as the backends keep them. */
static inline void qk_aio_list_append(QkAioReq **head, QkAioReq **tail, QkAioReq *req)
{
    req->next = NULL;
    if (*tail) {
        (*tail)->next = req;
    } else {
        *head = req;
    }
    *tail = req;
}

/* Turns a newest-first list (as pushed by a completing thread) into
 * completion order. */
static inline QkAioReq *qk_aio_list_reverse(QkAioReq *list)
{
    QkAioReq *rev = NULL;
    while (list) {
        QkAioReq *n = list->next;
        list->next = rev;
        rev = list;
        list = n;
    }
    return rev;
}

/* Each returns a backend state or NULL, with *ops filled in. errno_out gets
 * the reason on failure. */
void *qk_uring_backend_new(QkAioBackend *ops, int *errno_out);
void *qk_threads_backend_new(QkAioBackend *ops, int *errno_out);
/* The pool for background coroutines' I/O: few workers at the lowest CPU
 * priority. */
void *qk_threads_backend_new_background(QkAioBackend *ops, int *errno_out);

/* Completes one request: sets its result and resumes its coroutine. */
void qk_aio_complete(QkAioReq *req, int64_t result);
/* Queues req on the calling thread's loop backend (used by aio.c). */
void qk_loop_queue_aio(QkAioReq *req);

#endif
