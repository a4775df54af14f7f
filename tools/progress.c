/*
 * Progress line (see progress.h).
 */
#include "progress.h"

void qk_progress_init(QkProgress *p, FILE *out, bool enabled)
{
    p->out = out;
    p->enabled = enabled;
    p->last_shown = -1;
}

int qk_progress_hundredths(uint64_t done, uint64_t total)
{
    if (total == 0 || done >= total) {
        return 10000;
    }
    return (int)((unsigned __int128)done * 10000 / total);
}

static void show(QkProgress *p, int h)
{
    fprintf(p->out, "    (%d.%02d/100%%)\r", h / 100, h % 100);
    fflush(p->out);
    p->last_shown = h;
}

void qk_progress_update(QkProgress *p, uint64_t done, uint64_t total)
{
    if (!p->enabled) {
        return;
    }
    int h = qk_progress_hundredths(done, total);
    if (h != p->last_shown) {
        show(p, h);
    }
}

void qk_progress_report(uint64_t done, uint64_t total, void *progress)
{
    qk_progress_update(progress, done, total);
}

void qk_progress_finish(QkProgress *p)
{
    if (!p->enabled) {
        return;
    }
    if (p->last_shown != 10000) {
        show(p, 10000);
    }
    fputc('\n', p->out);
    fflush(p->out);
}
