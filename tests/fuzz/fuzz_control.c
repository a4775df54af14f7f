/*
 * Fuzz target: the control socket's JSON command handling. The input is
 * what a client would send on the socket: one request per line, each run
 * through qk_co_control_execute() (the dispatcher the socket uses) against
 * a daemon with one writable export "e0" over a small qcow2 image, and the
 * reply serialized as the socket would. Every input starts from the same
 * state: jobs are cancelled and the server shut down after it.
 *
 * Commands name files (export-add's and backup-export-start's "file",
 * mirror-start's and backup-start's "target", backup-start's "backing",
 * and TMPDIR for backup-export-start's temporary image); the
 * harness keeps them inside its private scratch directory by replacing any
 * name that is not a plain file name there with "img", a copy of the base
 * image, so a fuzz run can neither touch other files nor reach the
 * network through nbd:// names.
 */
#include "fuzz_common.h"
#include "aio/loop.h"
#include "block/block.h"
#include "daemon/control.h"
#include "daemon/daemon.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_LINES 64

typedef struct Run {
    const uint8_t *data;
    size_t size;
    const uint8_t *base;
    size_t base_len;
} Run;

static bool safe_name(const char *s)
{
    if (!s[0] || s[0] == '.' || strlen(s) > 32) {
        return false;
    }
    for (const char *p = s; *p; p++) {
        bool ok = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                  *p == '_' || *p == '-' || *p == '.';
        if (!ok) {
            return false;
        }
    }
    return true;
}

/* Returns a line to execute instead of the input's when a file name had
 * to be replaced (caller frees), or NULL to run the line as it is. */
static char *sandboxed(const char *line, size_t len)
{
    json_t *req = json_loadb(line, len, 0, NULL);
    json_t *args = json_object_get(req, "arguments");
    bool changed = false;
    static const char *const keys[] = {"file", "target", "backing"};
    for (size_t i = 0; json_is_object(args) && i < sizeof(keys) / sizeof(keys[0]); i++) {
        json_t *v = json_object_get(args, keys[i]);
        if (json_is_string(v) && !safe_name(json_string_value(v))) {
            json_object_set_new(args, keys[i], json_string("img"));
            changed = true;
        }
    }
    char *out = changed ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    return out;
}

static void write_file(const char *name, const uint8_t *data, size_t len)
{
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        return;
    }
    if (write(fd, data, len) != (ssize_t)len) {
        /* A short copy is just another image for the commands to reject. */
    }
    close(fd);
}

static void coroutine_fn execute_lines(QkDaemon *d, const char *text, size_t size)
{
    size_t pos = 0;
    for (int n = 0; pos < size && n < MAX_LINES; n++) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - (text + pos)) : size - pos;
        char *alt = sandboxed(text + pos, len);
        json_t *reply = alt ? qk_co_control_execute(d, alt, strlen(alt))
                            : qk_co_control_execute(d, text + pos, len);
        free(alt);
        free(reply ? json_dumps(reply, JSON_COMPACT) : NULL);
        json_decref(reply);
        pos += len + 1;
    }
}

static void coroutine_fn run_co(void *opaque)
{
    Run *r = opaque;
    char path[64];
    int fd = fuzz_memfd(r->base, r->base_len, path, sizeof(path));
    QkNbdServer *srv = qk_nbd_server_new(NULL);
    QkDaemon *d = srv ? qk_daemon_new_detached(srv) : NULL;
    QkError err = {0};
    QkOpenOptions o = {.flags = QK_OPEN_RDWR, .format = "qcow2"};
    QkBlock *bs = fd >= 0 && d ? qk_co_block_open(path, &o, &err) : NULL;
    if (bs && qk_nbd_server_add_export(srv, "e0", NULL, bs, false, NULL, &err) < 0) {
        qk_co_block_close(bs);
        bs = NULL;
    }
    if (bs) {
        execute_lines(d, (const char *)r->data, r->size);
    }
    qk_co_control_jobs_shutdown();
    if (srv) {
        qk_co_nbd_server_shutdown(srv);
        qk_nbd_server_free(srv);
    }
    if (d) {
        qk_daemon_free_detached(d);
    }
    if (fd >= 0) {
        close(fd);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_init();
    if (size > 64 * 1024 || !fuzz_scratch_dir()) {
        return 0;
    }
    /* backup-export-start's temporary images go there too. */
    setenv("TMPDIR", ".", 1);
    Run r = {.data = data, .size = size};
    r.base = fuzz_base_image(&r.base_len);
    if (!r.base) {
        return 0;
    }
    /* Files the previous input made (mirror targets) go; "img" is fresh. */
    fuzz_scratch_clean();
    write_file("img", r.base, r.base_len);
    qk_co_run(run_co, &r);
    return 0;
}
