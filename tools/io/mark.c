/*
 * `mark TEXT...`: a checkpoint for crash tests. It prints "mark TEXT" (so a
 * test that SIGKILLs `qcowkit io` knows from the output how far the
 * commands got) and appends TEXT to the write log when QCOWKIT_LOG_WRITES
 * is set (so the replay knows where in the host writes the guest was).
 * It waits for nothing: run aio_flush and flush before it to mark a point
 * where everything before is durable.
 */
#include "io/io.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int coroutine_fn mark_f(QkIo *io, int argc, char **argv)
{
    (void)io;
    char text[1024];
    size_t used = 0;
    text[0] = '\0';
    for (int i = 1; i < argc; i++) {
        int n = snprintf(text + used, sizeof(text) - used, "%s%s", i > 1 ? " " : "", argv[i]);
        if (n < 0 || (size_t)n >= sizeof(text) - used) {
            printf("mark failed: text too long\n");
            return -EINVAL;
        }
        used += (size_t)n;
    }
    int r = qk_write_log_mark(text);
    if (r < 0) {
        printf("mark failed: %s\n", strerror(-r));
        return r;
    }
    printf("mark %s\n", text);
    return 0;
}

const QkIoCmd qk_io_mark_cmds[] = {
    {"mark", NULL, 1, -1, "text...", "prints text and records it in the write log (crash tests)",
     mark_f},
    {NULL, NULL, 0, 0, NULL, NULL, NULL},
};
