/*
 * The library's tuning knobs, in one table: each has a name for
 * qk_set_tunable(), an environment variable that sets it when the program
 * did not, a default, and a line of documentation (printed in the ENVIRONMENT
 * sections of qcowkit(1)). Read when an event loop or a file is set up, so
 * a change applies to those made afterwards.
 *
 * Owns: the values set through the API, the lookup order API > env > default.
 */
#ifndef QK_UTIL_TUNABLES_H
#define QK_UTIL_TUNABLES_H

#include <stdint.h>

#include "qcowkit/engine.h" /* QkTunable, QkTunableInfo, qk_tunable_info */

/* The knob's value now. Safe from any thread. */
int64_t qk_tunable(QkTunable t);
/* Sets a knob by name from a decimal string: 0, -ENOENT (no such knob) or
 * -EINVAL (not a number in range). */
int qk_tunable_set(const char *name, const char *value);

#endif
