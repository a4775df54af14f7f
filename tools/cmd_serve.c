/*
 * `qcowkit serve`: exports images over NBD with a JSON control socket.
 * Only turns the command line into a QkDaemonConfig; src/daemon runs it.
 */
#include "cmd.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "Usage: qcowkit serve --export name=NAME,file=PATH[,format=qcow2|raw][,readonly=on]\n"
    "                     [,cache=none|writeback|writethrough|directsync|unsafe]\n"
    "                     [,cache-size=SIZE]\n"
    "                     [--export ...] [--socket PATH | --bind ADDR [--port N]]\n"
    "                     [--control PATH] [--pidfile FILE] [--max-in-flight N]\n"
    "                     [--handshake-limit N]\n"
    "\n"
    "Exports images over NBD (fixed newstyle, structured replies, base:allocation)\n"
    "until SIGTERM/SIGINT or the control command \"quit\". Clients reach an export\n"
    "as nbd+unix:///NAME?socket=PATH or nbd://ADDR:PORT/NAME. The control socket\n"
    "takes one JSON object per line, e.g. {\"execute\": \"query-exports\"}; see\n"
    "'qcowkit help ctl'.\n"
    "\n"
    "  --export SPEC      an image to export (repeatable); a comma in a value is ',,';\n"
    "                     cache-size bounds a qcow2 image's metadata cache\n"
    "  --socket PATH      listen on a unix socket\n"
    "  --bind ADDR        listen on TCP at ADDR (port 10809 unless --port)\n"
    "  --port N           TCP port\n"
    "  --control PATH     JSON control socket (unix)\n"
    "  --pidfile FILE     write the process id once listening\n"
    "  --max-in-flight N  requests in flight per client (default 64)\n"
    "  --handshake-limit N  seconds a client may take to negotiate before it is\n"
    "                     disconnected (default 10; 0: no limit)\n";

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        {"export", required_argument, NULL, 'e'},
        {"socket", required_argument, NULL, 's'},
        {"bind", required_argument, NULL, 'b'},
        {"port", required_argument, NULL, 'p'},
        {"control", required_argument, NULL, 'c'},
        {"pidfile", required_argument, NULL, 'P'},
        {"max-in-flight", required_argument, NULL, 'm'},
        {"handshake-limit", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    QkExportSpec *specs = calloc((size_t)argc, sizeof(*specs));
    QkDaemonConfig cfg = {0};
    int ret = 1;
    if (!specs) {
        qk_tool_error("out of memory");
        return 1;
    }
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "e:s:b:p:c:P:m:H:h", opts, NULL)) != -1) {
        switch (c) {
        case 'e': {
            QkError err = {0};
            if (qk_export_spec_parse(optarg, &specs[cfg.nexports], &err) < 0) {
                qk_tool_error("--export '%s': %s", optarg, err.msg);
                goto out;
            }
            cfg.nexports++;
            break;
        }
        case 's': cfg.socket_path = optarg; break;
        case 'b': cfg.bind_addr = optarg; break;
        case 'p': cfg.port = optarg; break;
        case 'c': cfg.control_path = optarg; break;
        case 'P': cfg.pidfile = optarg; break;
        case 'm': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 1 || v > 4096) {
                qk_tool_error("Invalid --max-in-flight '%s' (1 to 4096)", optarg);
                goto out;
            }
            cfg.max_in_flight = (unsigned)v;
            break;
        }
        case 'H': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 0 || v > 86400) {
                qk_tool_error("Invalid --handshake-limit '%s' (0 to 86400 seconds)", optarg);
                goto out;
            }
            cfg.handshake_limit = v ? (int)v : -1;
            break;
        }
        case 'h':
            fputs(usage, stdout);
            ret = 0;
            goto out;
        default:
            ret = qk_tool_bad_usage("serve", "invalid option");
            goto out;
        }
    }
    if (optind < argc) {
        ret = qk_tool_bad_usage("serve", "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    if (!cfg.socket_path && !cfg.bind_addr && !cfg.port) {
        ret = qk_tool_bad_usage("serve", "give --socket PATH or --bind ADDR");
        goto out;
    }
    cfg.exports = specs;
    QkError err = {0};
    if (qk_daemon_run(&cfg, &err) < 0) {
        qk_tool_error("%s", err.msg);
        goto out;
    }
    ret = 0;
out:
    for (size_t i = 0; i < cfg.nexports; i++) {
        qk_export_spec_clear(&specs[i]);
    }
    free(specs);
    return ret;
}

const QkCommand qk_cmd_serve = {
    .name = "serve",
    .summary = "export images over NBD, with a JSON control socket",
    .usage = usage,
    .run = run,
};
