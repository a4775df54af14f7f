/*
 * `qcowkit ctl SOCKET COMMAND [key=value...]`: sends one command to a
 * serve daemon's control socket and prints the reply as indented JSON.
 * Values that read as integers or true/false are sent as such; anything
 * else is a string. Exit status 1 when the reply is an error.
 */
#include "cmd.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char usage[] =
    "Usage: qcowkit ctl SOCKET COMMAND [KEY=VALUE...]\n"
    "\n"
    "Sends {\"execute\": COMMAND, \"arguments\": {KEY: VALUE...}} to the control socket\n"
    "of 'qcowkit serve' and prints the reply. VALUE is sent as a number when it is\n"
    "an integer, as a boolean for true/false, as JSON when it is a JSON list or\n"
    "object ('[\"b1\",\"b2\"]'), else as a string. Exits 1 when the\n"
    "reply is an error.\n"
    "\n"
    "Commands: query-exports, export-add name=N file=F [format=F] [readonly=true]\n"
    "          [cache=MODE] [cache-size=SIZE], export-del name=N, quit\n"
    "  jobs:   mirror-start export=E target=T [mode=background|write-blocking] ...,\n"
    "          backup-start export=E target=T sync=full|incremental|bitmap|none\n"
    "          [bitmap=B] [bitmap-mode=on-success|never|always] [backing=PREV]\n"
    "          [backing-format=F] [format=F] [target-cache=MODE] [speed=RATE]\n"
    "          [granularity=SIZE] [id=J],\n"
    "          backup-export-start export=E name=VIEW [bitmap=B] [file=TEMP] [id=J],\n"
    "          query-jobs, job-complete id=J [switch=true],\n"
    "          job-cancel id=J [wait=true], job-set-speed id=J speed=RATE,\n"
    "          job-pause id=J, job-resume id=J, job-dismiss id=J\n"
    "  bitmaps: block-dirty-bitmap-add export=E name=B [granularity=SIZE]\n"
    "          [persistent=true] [disabled=true], block-dirty-bitmap-remove|clear|\n"
    "          enable|disable export=E name=B, block-dirty-bitmap-merge export=E\n"
    "          target=B bitmaps='[\"B1\",...]', block-dirty-bitmap-query [export=E]\n"
    "\n"
    "backup-start copies the export as it is when the job starts, while its clients\n"
    "keep writing: a write to a range not copied yet first copies the old data to\n"
    "the target. A target that does not exist is created (over backing, the previous\n"
    "backup, for an increment). With a bitmap, the bitmap records the writes made\n"
    "since the start; it gets back what the job took if the job fails or is\n"
    "cancelled (bitmap-mode on-success, the only mode of sync=incremental).\n"
    "backup-export-start exports the same point in time read-only as VIEW, with\n"
    "the bitmap as of that moment as its qemu:dirty-bitmap:B context, for a backup\n"
    "client to pull (old data the clients of E overwrite is kept in TEMP, by default\n"
    "a new file under $TMPDIR or /var/tmp); job-complete ends it, job-cancel too and\n"
    "gives the bitmap back; either removes VIEW and TEMP.\n";

static json_t *auto_value(const char *v)
{
    if (!strcmp(v, "true")) {
        return json_true();
    }
    if (!strcmp(v, "false")) {
        return json_false();
    }
    if (*v == '[' || *v == '{') {
        json_t *j = json_loads(v, 0, NULL);
        if (j) {
            return j;
        }
    }
    if (*v) {
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        if (!*end && errno == 0) {
            return json_integer(n);
        }
    }
    return json_string(v);
}

static int send_all(int fd, const char *s, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        s += n;
        len -= (size_t)n;
    }
    return 0;
}

static int run(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(usage, stdout);
        return 0;
    }
    if (argc < 3) {
        return qk_tool_bad_usage("ctl", "expected SOCKET and COMMAND");
    }
    json_t *args = json_object();
    for (int i = 3; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq == argv[i]) {
            json_decref(args);
            return qk_tool_bad_usage("ctl", "argument '%s' is not KEY=VALUE", argv[i]);
        }
        char *key = strndup(argv[i], (size_t)(eq - argv[i]));
        json_object_set_new(args, key, auto_value(eq + 1));
        free(key);
    }
    json_t *req = json_pack("{s:s,s:o}", "execute", argv[2], "arguments", args);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);

    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(argv[1]) >= sizeof(sa.sun_path)) {
        free(line);
        qk_tool_error("socket path '%s' is too long", argv[1]);
        return 1;
    }
    strcpy(sa.sun_path, argv[1]);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        qk_tool_error("Could not connect to '%s': %s", argv[1], strerror(errno));
        free(line);
        if (fd >= 0) {
            close(fd);
        }
        return 1;
    }
    int r = send_all(fd, line, strlen(line));
    if (r == 0) {
        r = send_all(fd, "\n", 1);
    }
    free(line);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (r == 0 && buf && !memchr(buf, '\n', len)) {
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            r = n < 0 ? -errno : -ECONNRESET;
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    if (r < 0 || !buf) {
        qk_tool_error("no reply from '%s': %s", argv[1], strerror(r < 0 ? -r : ENOMEM));
        free(buf);
        return 1;
    }
    json_error_t jerr;
    json_t *reply = json_loadb(buf, (size_t)((char *)memchr(buf, '\n', len) - buf), 0, &jerr);
    free(buf);
    if (!reply) {
        qk_tool_error("unreadable reply: %s", jerr.text);
        return 1;
    }
    char *out = json_dumps(reply, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (out) {
        puts(out);
        free(out);
    }
    int status = json_object_get(reply, "error") ? 1 : 0;
    json_decref(reply);
    return status;
}

const QkCommand qk_cmd_ctl = {
    .name = "ctl",
    .summary = "send a command to a serve daemon's control socket",
    .usage = usage,
    .run = run,
};
