/*
 * Coroutine implementation: x86-64 context switch in a few instructions,
 * mmap'd stacks with a guard page below each, and a free list so creating a
 * coroutine is usually just popping a pooled one. A pooled coroutine keeps
 * its trampoline frame alive, so reuse costs one switch and no set-up.
 *
 * Owns: stacks, switching, the "current coroutine" pointer, sanitizer fiber
 * annotations. Does not know about the event loop except to hand it wakes.
 */
#include "aio/coroutine.h"
#include "aio/loop.h"

#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define QK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QK_ASAN 1
#endif
#endif
#ifdef QK_ASAN
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "qcowkit coroutines currently need x86-64"
#endif

#define STACK_SIZE (256 * 1024)
#define POOL_MAX 512

typedef struct Ctx {
    void *sp;
    void *stack_bottom;   /* lowest usable address (for sanitizers) */
    size_t stack_size;
} Ctx;

struct QkCoroutine {
    Ctx ctx;
    void *map;            /* mmap base including guard page */
    size_t map_len;
    QkCoroutineEntry *entry;
    void *opaque;
    QkCoroutine *caller;  /* who entered us; NULL when not running */
    QkCoroutine *pool_next;
    bool finished;
    bool scheduled;       /* in the loop's wake list */
    bool background;      /* its host I/O yields the CPU to everyone else */
    QkCoroutine *wake_next;
#ifdef QK_ASAN
    void *fake_stack;
#endif
};

/* The thread's own stack, represented as a coroutine so switching is uniform. */
static __thread QkCoroutine leader;
static __thread QkCoroutine *current;
static __thread QkCoroutine *pool;
static __thread unsigned pool_len;

/* void qk_ctx_switch(void **save_sp, void *new_sp): saves callee-saved
 * registers on the current stack, stores rsp, loads the other rsp, restores. */
__asm__(
    ".text\n"
    ".globl qk_ctx_switch\n"
    ".type qk_ctx_switch,@function\n"
    "qk_ctx_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size qk_ctx_switch, .-qk_ctx_switch\n");
void qk_ctx_switch(void **save_sp, void *new_sp);

static void switch_to(QkCoroutine *from, QkCoroutine *to)
{
#ifdef QK_ASAN
    /* A finishing coroutine passes NULL so ASan frees its fake stack; when
     * the pooled coroutine is reused it starts like a new fiber. */
    if (from->finished) {
        from->fake_stack = NULL;
    }
    __sanitizer_start_switch_fiber(from->finished ? NULL : &from->fake_stack,
                                   to->ctx.stack_bottom, to->ctx.stack_size);
#endif
    current = to;
    qk_ctx_switch(&from->ctx.sp, to->ctx.sp);
#ifdef QK_ASAN
    __sanitizer_finish_switch_fiber(from->fake_stack, NULL, NULL);
#endif
}

static void trampoline(void)
{
    QkCoroutine *self = current;
#ifdef QK_ASAN
    __sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
    for (;;) {
        self->entry(self->opaque);
        self->finished = true;
        QkCoroutine *caller = self->caller;
        self->caller = NULL;
        switch_to(self, caller);
        /* Resumed from the pool with a new entry. */
        self = current;
    }
}

static QkCoroutine *co_new(void)
{
    long page = sysconf(_SC_PAGESIZE);
    QkCoroutine *co = calloc(1, sizeof(*co));
    if (!co) {
        return NULL;
    }
    co->map_len = STACK_SIZE + page;
    co->map = mmap(NULL, co->map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (co->map == MAP_FAILED) {
        free(co);
        return NULL;
    }
    /* Guard page below the stack: an overflow faults instead of scribbling. */
    mprotect(co->map, page, PROT_NONE);
    co->ctx.stack_bottom = (char *)co->map + page;
    co->ctx.stack_size = STACK_SIZE;

    uintptr_t top = ((uintptr_t)co->map + co->map_len) & ~(uintptr_t)15;
    uintptr_t *sp = (uintptr_t *)top;
    *--sp = 0;                        /* fake return address of trampoline */
    *--sp = (uintptr_t)trampoline;    /* ret target of the first switch */
    for (int i = 0; i < 6; i++) {
        *--sp = 0;                    /* rbp rbx r12 r13 r14 r15 */
    }
    co->ctx.sp = sp;
    return co;
}

QkCoroutine *qk_coroutine_create(QkCoroutineEntry *entry, void *opaque)
{
    QkCoroutine *co = pool;
    if (co) {
        pool = co->pool_next;
        pool_len--;
    } else {
        co = co_new();
        if (!co) {
            abort(); /* no stack: the caller has no way to go on (see qcowkit.h) */
        }
    }
    co->entry = entry;
    co->opaque = opaque;
    co->finished = false;
    co->scheduled = false;
    co->caller = NULL;
    /* Work a background coroutine spawns is background work too. */
    co->background = current && current->background;
    return co;
}

void qk_coroutine_set_background(bool on)
{
    if (current && current != &leader) {
        current->background = on;
    }
}

bool qk_coroutine_is_background(void)
{
    return current && current->background;
}

static void co_release(QkCoroutine *co)
{
    if (pool_len < POOL_MAX) {
        co->pool_next = pool;
        pool = co;
        pool_len++;
        return;
    }
    munmap(co->map, co->map_len);
    free(co);
}

void qk_coroutine_enter(QkCoroutine *co)
{
    QkCoroutine *self = current ? current : &leader;
    if (!current) {
        current = &leader;
#ifdef QK_ASAN
        if (!leader.ctx.stack_size) {
            pthread_attr_t attr;
            pthread_getattr_np(pthread_self(), &attr);
            pthread_attr_getstack(&attr, &leader.ctx.stack_bottom, &leader.ctx.stack_size);
            pthread_attr_destroy(&attr);
        }
#endif
    }
    assert(co->caller == NULL && "entering a coroutine that is already running");
    co->caller = self;
    switch_to(self, co);
    if (co->finished) {
        co_release(co);
    }
}

void coroutine_fn qk_coroutine_yield(void)
{
    QkCoroutine *self = current;
    assert(self && self != &leader && "yield outside a coroutine");
    QkCoroutine *caller = self->caller;
    self->caller = NULL;
    switch_to(self, caller);
}

QkCoroutine *qk_coroutine_self(void)
{
    return (current && current != &leader) ? current : NULL;
}

bool qk_in_coroutine(void)
{
    return current && current != &leader;
}

void qk_coroutine_wake(QkCoroutine *co)
{
    if (co->scheduled) {
        return;
    }
    co->scheduled = true;
    qk_loop_schedule_co(qk_loop_get(), co);
}

/* Loop side of a wake: clears the flag and enters. */
void qk_coroutine_run_scheduled(QkCoroutine *co)
{
    co->scheduled = false;
    qk_coroutine_enter(co);
}

QkCoroutine **qk_coroutine_wake_next(QkCoroutine *co)
{
    return &co->wake_next;
}

size_t qk_coroutine_stack_size(void)
{
    return STACK_SIZE;
}

void qk_coroutine_pool_drain(void)
{
    while (pool) {
        QkCoroutine *co = pool;
        pool = co->pool_next;
        munmap(co->map, co->map_len);
        free(co);
    }
    pool_len = 0;
}
