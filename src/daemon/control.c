/*
 * The control socket server: accepts connections on a unix socket, reads
 * one request per line, dispatches through the command tables and writes
 * one reply per line. See control.h.
 */
#include "daemon/control.h"
#include "util/size.h"
#include "aio/co_sync.h"
#include "aio/loop.h"
#include "nbd/sockio.h"
#include "common/checked.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* How long stop waits for connections to finish on their own. */
#define STOP_GRACE_NS (5LL * 1000 * 1000 * 1000)

/* Every area's commands; a new area adds its table here. */
static const QkControlTable *const tables[] = {
    &qk_control_daemon_table,
    &qk_control_export_table,
    &qk_control_job_table,
    &qk_control_backup_table,
    &qk_control_bitmap_table,
};

#define MAX_LINE (1u << 20)
/* accept() failing for a reason other than "none pending" (out of file
 * descriptors, say): try again after this long rather than spin. */
#define ACCEPT_RETRY_NS (100 * 1000 * 1000)
#define LISTEN_BACKLOG 16

typedef struct Conn {
    QkControl *ctl;
    int fd;
    struct Conn *next;
} Conn;

struct QkControl {
    QkDaemon *d;
    int fd;
    char *path;
    bool running;
    bool accepting;
    Conn *conns;
    unsigned nconns;
    QkCoQueue changed;          /* woken when a coroutine of ours ends */
};

static const QkControlCommand *find_command(const char *name)
{
    for (size_t t = 0; t < QK_ARRAY_SIZE(tables); t++) {
        for (size_t i = 0; i < tables[t]->ncmds; i++) {
            if (strcmp(tables[t]->cmds[i].name, name) == 0) {
                return &tables[t]->cmds[i];
            }
        }
    }
    return NULL;
}

static json_t *error_reply(const char *cls, const char *desc)
{
    return json_pack("{s:{s:s,s:s}}", "error", "class", cls, "desc", desc);
}

static bool param_allowed(const QkControlCommand *cmd, const char *key)
{
    for (const char *const *p = cmd->params; p && *p; p++) {
        if (strcmp(*p, key) == 0) {
            return true;
        }
    }
    return false;
}

json_t *coroutine_fn qk_co_control_execute(QkDaemon *d, const char *line, size_t len)
{
    json_error_t jerr;
    /* A repeated key would otherwise run with whichever value the parser
     * kept last: refuse it, as QMP does, rather than guess. */
    json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!req) {
        char desc[256];
        snprintf(desc, sizeof(desc), "JSON parse error: %s", jerr.text);
        return error_reply("GenericError", desc);
    }
    json_t *reply = NULL;
    json_t *id = json_object_get(req, "id");
    const char *name = json_string_value(json_object_get(req, "execute"));
    json_t *args = json_object_get(req, "arguments");
    if (!json_is_object(req)) {
        reply = error_reply("GenericError", "a request must be a JSON object");
        id = NULL;
    } else if (!name) {
        reply = error_reply("GenericError", "missing string member 'execute'");
    } else if (args && !json_is_object(args)) {
        reply = error_reply("GenericError", "'arguments' must be an object");
    } else {
        const QkControlCommand *cmd = find_command(name);
        if (!cmd) {
            char desc[300];
            snprintf(desc, sizeof(desc), "The command %.200s has not been found", name);
            reply = error_reply("CommandNotFound", desc);
        } else {
            const char *key;
            json_t *val;
            json_object_foreach(args, key, val) {
                if (!param_allowed(cmd, key)) {
                    char desc[300];
                    snprintf(desc, sizeof(desc), "Parameter '%.200s' is unexpected", key);
                    reply = error_reply("GenericError", desc);
                    break;
                }
            }
            if (!reply) {
                json_t *empty = args ? json_incref(args) : json_object();
                QkError err = {0};
                json_t *ret = cmd->handler(d, empty, &err);
                json_decref(empty);
                if (ret) {
                    reply = json_pack("{s:o}", "return", ret);
                } else {
                    reply = error_reply("GenericError", err.code ? err.msg : "command failed");
                }
            }
        }
    }
    if (reply && id) {
        json_object_set(reply, "id", id);
    }
    json_decref(req);
    return reply;
}

int qk_control_arg_string(json_t *args, const char *key, bool required, const char **out,
                          QkError *err)
{
    json_t *v = json_object_get(args, key);
    if (!v) {
        *out = NULL;
        return required ? qk_error_set(err, -EINVAL, "Parameter '%s' is missing", key) : 0;
    }
    if (!json_is_string(v)) {
        return qk_error_set(err, -EINVAL, "Parameter '%s' expects a string", key);
    }
    *out = json_string_value(v);
    return 0;
}

int qk_control_arg_size(json_t *args, const char *key, uint64_t *out, QkError *err)
{
    json_t *v = json_object_get(args, key);
    if (!v) {
        return 0;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *out = (uint64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_string(v) && qk_parse_size(json_string_value(v), out) == 0) {
        return 0;
    }
    return qk_error_set(err, -EINVAL, "Parameter '%s' expects a size", key);
}

int qk_control_arg_bool(json_t *args, const char *key, bool *out, QkError *err)
{
    json_t *v = json_object_get(args, key);
    if (!v) {
        return 0;
    }
    if (json_is_boolean(v)) {
        *out = json_is_true(v);
        return 0;
    }
    const char *s = json_string_value(v);
    if (s && (!strcmp(s, "on") || !strcmp(s, "true"))) {
        *out = true;
    } else if (s && (!strcmp(s, "off") || !strcmp(s, "false"))) {
        *out = false;
    } else {
        return qk_error_set(err, -EINVAL, "Parameter '%s' expects a boolean", key);
    }
    return 0;
}

/* ---- connections ---- */

static int coroutine_fn send_reply(int fd, json_t *reply)
{
    char *s = reply ? json_dumps(reply, JSON_COMPACT) : NULL;
    if (!s) {
        return -ENOMEM;
    }
    size_t n = strlen(s);
    struct iovec iov[2] = {{s, n}, {"\n", 1}};
    int r = qk_co_sock_writev(fd, iov, 2);
    free(s);
    return r;
}

static void coroutine_fn conn_entry(void *opaque)
{
    Conn *c = opaque;
    QkControl *ctl = c->ctl;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf && ctl->running) {
        char *nl = memchr(buf, '\n', len);
        if (nl) {
            size_t ll = (size_t)(nl - buf);
            /* Blank lines are keep-alives, not requests. */
            bool blank = true;
            for (size_t i = 0; i < ll; i++) {
                blank &= buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r';
            }
            if (!blank) {
                json_t *reply = qk_co_control_execute(ctl->d, buf, ll);
                int r = send_reply(c->fd, reply);
                json_decref(reply);
                if (r < 0) {
                    break;
                }
            }
            memmove(buf, nl + 1, len - ll - 1);
            len -= ll + 1;
            continue;
        }
        if (len == cap) {
            if (cap >= MAX_LINE) {
                json_t *reply = error_reply("GenericError", "request line too long");
                send_reply(c->fd, reply);
                json_decref(reply);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t n = recv(c->fd, buf + len, cap - len, 0);
        if (n == 0) {
            break;
        }
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                break;
            }
            if (qk_co_wait_fd(c->fd, POLLIN, -1) < 0) {
                break;
            }
            continue;
        }
        len += (size_t)n;
    }
    free(buf);
    Conn **pp = &ctl->conns;
    while (*pp != c) {
        pp = &(*pp)->next;
    }
    *pp = c->next;
    ctl->nconns--;
    close(c->fd);
    free(c);
    qk_co_queue_wake_all(&ctl->changed);
}

static void coroutine_fn accept_entry(void *opaque)
{
    QkControl *ctl = opaque;
    while (ctl->running) {
        int fd = accept4(ctl->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (qk_co_wait_fd(ctl->fd, POLLIN, -1) < 0) {
                    break;
                }
            } else if (errno != EINTR && errno != ECONNABORTED) {
                qk_co_sleep_ns(ACCEPT_RETRY_NS);
            }
            continue;
        }
        Conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->ctl = ctl;
        c->fd = fd;
        c->next = ctl->conns;
        ctl->conns = c;
        ctl->nconns++;
        qk_coroutine_wake(qk_coroutine_create(conn_entry, c));
    }
    ctl->accepting = false;
    qk_co_queue_wake_all(&ctl->changed);
}

QkControl *qk_control_listen(QkDaemon *d, const char *path, QkError *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        qk_error_set(err, -ENAMETOOLONG, "control socket path '%s' is too long", path);
        return NULL;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        qk_error_set_errno(err, -errno, "Could not create socket");
        return NULL;
    }
    unlink(path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, LISTEN_BACKLOG) < 0) {
        qk_error_set_errno(err, -errno, "Could not listen on '%s'", path);
        close(fd);
        return NULL;
    }
    QkControl *ctl = calloc(1, sizeof(*ctl));
    if (!ctl || !(ctl->path = strdup(path))) {
        free(ctl);
        close(fd);
        unlink(path);
        qk_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    ctl->d = d;
    ctl->fd = fd;
    ctl->running = true;
    ctl->accepting = true;
    qk_co_queue_init(&ctl->changed);
    qk_coroutine_wake(qk_coroutine_create(accept_entry, ctl));
    return ctl;
}

void coroutine_fn qk_co_control_stop(QkControl *ctl)
{
    ctl->running = false;
    qk_loop_cancel_fd_wait(qk_loop_get(), ctl->fd);
    for (Conn *c = ctl->conns; c; c = c->next) {
        /* EOF for the reader; a reply being written still goes out. */
        shutdown(c->fd, SHUT_RD);
    }
    /* A client that stopped reading our replies would block its
     * connection's last write forever: after a grace period the write
     * side is cut too, as the NBD server cuts its clients. */
    int64_t deadline = qk_clock_ns() + STOP_GRACE_NS;
    while (ctl->nconns > 0 && qk_clock_ns() < deadline) {
        qk_co_sleep_ns(10 * 1000 * 1000);
    }
    for (Conn *c = ctl->conns; c; c = c->next) {
        shutdown(c->fd, SHUT_RDWR);
    }
    while (ctl->accepting || ctl->nconns > 0) {
        qk_co_queue_wait(&ctl->changed);
    }
    close(ctl->fd);
    unlink(ctl->path);
}

void qk_control_free(QkControl *ctl)
{
    if (ctl) {
        free(ctl->path);
        free(ctl);
    }
}
