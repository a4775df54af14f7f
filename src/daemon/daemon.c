/*
 * The daemon's life: open the exports, listen, write the pidfile, wait for
 * SIGTERM/SIGINT or "quit", then shut down in order (control socket, NBD
 * clients after their requests in flight, then flush and close images).
 *
 * Owns: startup/shutdown order, signals, pidfile. Must not know the NBD
 * wire format or the JSON framing.
 */
#include "daemon/control.h"
#include "daemon/daemon.h"
#include "aio/co_sync.h"
#include "aio/loop.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

struct QkDaemon {
    const QkDaemonConfig *cfg;
    QkNbdServer *srv;
    QkControl *ctl;
    int sigfd;
    bool quit;
    bool sig_running;
    QkCoQueue wake;             /* main waits here for quit / watcher exit */
    QkError *err;
    int ret;
};

QkNbdServer *qk_daemon_nbd_server(QkDaemon *d)
{
    return d->srv;
}

void qk_daemon_request_quit(QkDaemon *d)
{
    d->quit = true;
    qk_co_queue_wake_all(&d->wake);
}

int coroutine_fn qk_co_daemon_add_export(QkDaemon *d, const QkExportSpec *spec, QkError *err)
{
    if (qk_nbd_server_find_export(d->srv, spec->name)) {
        return qk_error_set(err, -EEXIST, "export '%s' already exists", spec->name);
    }
    QkOpenOptions o = {.flags = (spec->readonly ? 0 : QK_OPEN_RDWR) | QK_OPEN_LOAD_BITMAPS, .format = spec->format,
                       .cache_size = spec->cache_size};
    if (spec->cache && qk_cache_mode_parse(spec->cache, &o.flags) < 0) {
        return qk_error_set(err, -EINVAL, "invalid cache mode '%s'", spec->cache);
    }
    QkBlock *bs = qk_co_block_open(spec->file, &o, err);
    if (!bs) {
        qk_error_prefix(err, "export '%s'", spec->name);
        return err->code ? err->code : -EIO;
    }
    int r = qk_nbd_server_add_export(d->srv, spec->name, spec->description, bs, spec->readonly,
                                     spec->cache, err);
    if (r < 0) {
        qk_co_block_close(bs);
    }
    return r;
}

static void coroutine_fn signal_entry(void *opaque)
{
    QkDaemon *d = opaque;
    while (!d->quit) {
        struct signalfd_siginfo si;
        ssize_t n = read(d->sigfd, &si, sizeof(si));
        if (n == (ssize_t)sizeof(si)) {
            qk_daemon_request_quit(d);
            break;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            break;
        }
        if (n < 0 && errno == EAGAIN && qk_co_wait_fd(d->sigfd, POLLIN, -1) < 0) {
            break; /* cancelled at shutdown */
        }
    }
    d->sig_running = false;
    qk_co_queue_wake_all(&d->wake);
}

static int write_pidfile(const char *path, QkError *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        return qk_error_set_errno(err, -errno, "Could not write pidfile '%s'", path);
    }
    fprintf(f, "%d\n", (int)getpid());
    /* Rename so a watcher never reads a half-written file. */
    if (fclose(f) != 0 || rename(tmp, path) < 0) {
        int e = -errno;
        unlink(tmp);
        return qk_error_set_errno(err, e, "Could not write pidfile '%s'", path);
    }
    return 0;
}

static int coroutine_fn start(QkDaemon *d)
{
    const QkDaemonConfig *cfg = d->cfg;
    for (size_t i = 0; i < cfg->nexports; i++) {
        int r = qk_co_daemon_add_export(d, &cfg->exports[i], d->err);
        if (r < 0) {
            return r;
        }
    }
    if (cfg->socket_path && qk_nbd_server_listen_unix(d->srv, cfg->socket_path, d->err) < 0) {
        return d->err->code;
    }
    if (cfg->bind_addr || cfg->port) {
        if (qk_nbd_server_listen_tcp(d->srv, cfg->bind_addr, cfg->port ? cfg->port : "10809",
                                     d->err) < 0) {
            return d->err->code;
        }
    }
    if (cfg->control_path) {
        d->ctl = qk_control_listen(d, cfg->control_path, d->err);
        if (!d->ctl) {
            return d->err->code;
        }
    }
    d->sig_running = true;
    qk_coroutine_wake(qk_coroutine_create(signal_entry, d));
    if (cfg->pidfile && write_pidfile(cfg->pidfile, d->err) < 0) {
        return d->err->code;
    }
    return 0;
}

static void coroutine_fn daemon_main(void *opaque)
{
    QkDaemon *d = opaque;
    d->ret = start(d);
    while (d->ret == 0 && !d->quit) {
        qk_co_queue_wait(&d->wake);
    }
    d->quit = true;
    /* Jobs end first (cancelled, so paused ones run again): a control
     * client waiting for one (job-complete wait=true) then gets its
     * answer, and stopping the control socket does not wait forever. */
    qk_control_jobs_cancel_all();
    if (d->ctl) {
        qk_co_control_stop(d->ctl);
    }
    qk_co_control_jobs_shutdown(); /* jobs use export nodes: end them first */
    int r = qk_co_nbd_server_shutdown(d->srv);
    if (r < 0 && d->ret == 0) {
        d->ret = qk_error_set_errno(d->err, r, "Closing the exports failed: their last writes may be lost");
    }
    if (d->sig_running) {
        qk_loop_cancel_fd_wait(qk_loop_get(), d->sigfd);
        while (d->sig_running) {
            qk_co_queue_wait(&d->wake);
        }
    }
    if (d->cfg->pidfile && d->ret == 0) {
        unlink(d->cfg->pidfile);
    }
}

int qk_daemon_run(const QkDaemonConfig *cfg, QkError *err)
{
    if (!cfg->socket_path && !cfg->bind_addr && !cfg->port) {
        return qk_error_set(err, -EINVAL, "nowhere to listen: give --socket or --bind/--port");
    }
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old);
    /* A client that hangs up must not kill the daemon. */
    signal(SIGPIPE, SIG_IGN);
    QkDaemon d = {.cfg = cfg, .err = err, .sigfd = -1};
    qk_co_queue_init(&d.wake);
    d.sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    QkNbdServerOptions so = {.max_in_flight = cfg->max_in_flight, .handshake_limit_s = cfg->handshake_limit};
    d.srv = qk_nbd_server_new(&so);
    if (d.sigfd < 0 || !d.srv) {
        int e = d.sigfd < 0 ? -errno : -ENOMEM;
        if (d.sigfd >= 0) {
            close(d.sigfd);
        }
        qk_nbd_server_free(d.srv);
        sigprocmask(SIG_SETMASK, &old, NULL);
        return qk_error_set_errno(err, e, "Could not start the daemon");
    }
    qk_co_run(daemon_main, &d);
    qk_control_free(d.ctl);
    qk_nbd_server_free(d.srv);
    close(d.sigfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return d.ret;
}

QkDaemon *qk_daemon_new_detached(QkNbdServer *srv)
{
    /* A config with nothing in it: start() never runs for this daemon. */
    static const QkDaemonConfig none;
    QkDaemon *d = calloc(1, sizeof(*d));
    if (d) {
        d->cfg = &none;
        d->srv = srv;
        d->sigfd = -1;
        qk_co_queue_init(&d->wake);
    }
    return d;
}

void qk_daemon_free_detached(QkDaemon *d)
{
    free(d);
}

/* ---- daemon-wide commands ---- */

static json_t *coroutine_fn cmd_quit(QkDaemon *d, json_t *args, QkError *err)
{
    (void)args;
    (void)err;
    qk_daemon_request_quit(d);
    return json_object();
}

static const QkControlCommand cmds[] = {
    {"quit", cmd_quit, NULL},
};

const QkControlTable qk_control_daemon_table = {cmds, sizeof(cmds) / sizeof(cmds[0])};
