/*
 * The public API's process-wide calls: version, error strings and the
 * choice of I/O backend and the tuning knobs (qk_version, qk_strerror,
 * qk_set_aio_backend, qk_set_tunable).
 */
#include "qcowkit/qcowkit.h"
#include "aio/loop.h"
#include "util/error.h"
#include "util/tunables.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

const char *qk_version(void)
{
    return QK_VERSION;
}

const char *qk_strerror(int err)
{
    if (err == -QK_ECORRUPT || err == QK_ECORRUPT) {
        return "image is corrupt";
    }
    if (err == 0) {
        return "Success";
    }
    if (err == INT_MIN) {
        return "Unknown error";
    }
    /* Negative as returned, or a positive errno a caller already negated.
     * glibc returns its static message for every known code. */
    const char *m = strerror(err < 0 ? -err : err);
    return m ? m : "Unknown error";
}

int qk_set_aio_backend(const char *name)
{
    return name ? qk_aio_set_backend_name(name) : -EINVAL;
}

int qk_set_tunable(const char *name, const char *value)
{
    return qk_tunable_set(name, value);
}
