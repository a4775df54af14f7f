/*
 * The public API's version and error strings (qk_version, qk_strerror):
 * what a program linked against the shared library can ask at run time.
 */
#include "qcowkit/qcowkit.h"
#include "util/error.h"

#include <errno.h>
#include <string.h>

const char *qk_version(void)
{
    return QK_VERSION;
}

const char *qk_strerror(int err)
{
    if (err == -QK_ECORRUPT) {
        return "image is corrupt";
    }
    if (err >= 0) {
        return "Success";
    }
    /* glibc returns its static message for every known code. */
    const char *m = strerror(-err);
    return m ? m : "Unknown error";
}
