/*
 * A one-line progress indicator in the style users know from
 * `qemu-img convert -p`: "    (42.00/100%)" redrawn in place with \r.
 * Redraws only when the shown value moves by at least 0.01%, so a fast
 * copy does not spend its time printing.
 *
 * Owns: formatting and throttling. Must not know what is being counted.
 */
#ifndef QK_TOOLS_PROGRESS_H
#define QK_TOOLS_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct QkProgress {
    FILE *out;
    bool enabled;
    int last_shown;   /* hundredths of a percent; -1 before the first line */
} QkProgress;

void qk_progress_init(QkProgress *p, FILE *out, bool enabled);
/* Shows done/total (total 0 counts as nothing left to do). */
void qk_progress_update(QkProgress *p, uint64_t done, uint64_t total);
/* The same as a job's progress callback: opaque is the QkProgress. */
void qk_progress_report(uint64_t done, uint64_t total, void *progress);
/* Shows 100% and ends the line. */
void qk_progress_finish(QkProgress *p);
/* Hundredths of a percent for done/total, clamped to 0..10000. */
int qk_progress_hundredths(uint64_t done, uint64_t total);

#endif
