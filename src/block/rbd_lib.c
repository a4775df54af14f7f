/*
 * Loads librbd with dlopen the first time an RBD node is opened or
 * created and resolves the calls the driver uses (see rbd_lib.h for why).
 * librados comes in as librbd's dependency, so one handle finds both.
 */
#include "block/rbd_lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

QkRbdLib qk_rbd_fn;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int load_status;
static char load_msg[256];

static void load(void)
{
    void *h = dlopen("librbd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_msg, sizeof load_msg, "Could not load librbd (Ceph RBD support): %s", dlerror());
        load_status = -ENOTSUP;
        return;
    }
#define QK_RBD_RESOLVE(name) \
    if (load_status == 0 && !(qk_rbd_fn.name = (__typeof__(qk_rbd_fn.name))dlsym(h, #name))) { \
        snprintf(load_msg, sizeof load_msg, "librbd lacks %s", #name); \
        load_status = -ENOTSUP; \
    }
    QK_RBD_FUNCS(QK_RBD_RESOLVE)
#undef QK_RBD_RESOLVE
}

int qk_rbd_lib_load(QkError *err)
{
    pthread_once(&once, load);
    if (load_status < 0) {
        return qk_error_set(err, load_status, "%s", load_msg);
    }
    return 0;
}
