/*
 * Loads libnbd with dlopen the first time an NBD node is opened and
 * resolves the calls the driver uses (see nbd_lib.h for why).
 */
#define QK_NBD_LIB_REAL /* the real prototypes, for __typeof__ below */
#include "block/nbd_lib.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>

QkNbdLib qk_nbd_fn;

static int load_status = 1; /* 1: not tried yet; else 0 or -errno */
static char load_msg[256];

int qk_nbd_lib_load(QkError *err)
{
    if (load_status == 1) {
        void *h = dlopen("libnbd.so.0", RTLD_NOW | RTLD_LOCAL);
        load_status = 0;
        if (!h) {
            snprintf(load_msg, sizeof load_msg, "Could not load libnbd: %s", dlerror());
            load_status = -ENOTSUP;
        }
#define QK_NBD_RESOLVE(name) \
        if (load_status == 0 && !(qk_nbd_fn.name = (__typeof__(qk_nbd_fn.name))dlsym(h, "nbd_" #name))) { \
            snprintf(load_msg, sizeof load_msg, "libnbd lacks nbd_%s", #name); \
            load_status = -ENOTSUP; \
        }
        QK_NBD_FUNCS(QK_NBD_RESOLVE)
#undef QK_NBD_RESOLVE
    }
    if (load_status < 0) {
        return qk_error_set(err, load_status, "%s", load_msg);
    }
    return 0;
}
