/*
 * The snapshot table as qemu-img shows it, shared by `qcowkit snapshot -l`
 * and `qcowkit info`: the human table and the JSON objects.
 */
#include "cmd.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

/* qemu's size_to_str: three significant digits, binary units. */
static void size_str(uint64_t v, char *buf, size_t len)
{
    static const char *const suffixes[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};
    int e;
    frexp((double)v / (1000.0 / 1024.0), &e);
    int i = (e - 1) / 10;
    snprintf(buf, len, "%0.3g %sB", (double)v / (double)(1ULL << (i * 10)), suffixes[i]);
}

void qk_tool_print_snapshots(const QkSnapshotInfo *l, int n)
{
    if (n == 0) {
        return;
    }
    printf("Snapshot list:\n");
    printf("%-10s%-17s%8s%20s%13s%11s\n", "ID", "TAG", "VM SIZE", "DATE", "VM CLOCK", "ICOUNT");
    for (int i = 0; i < n; i++) {
        char sz[32], date[32], clk[48], ic[24] = "";
        size_str(l[i].vm_state_size, sz, sizeof(sz));
        time_t t = (time_t)l[i].date_sec;
        struct tm tm;
        localtime_r(&t, &tm);
        strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
        uint64_t secs = l[i].vm_clock_nsec / 1000000000ULL;
        snprintf(clk, sizeof(clk), "%02d:%02d:%02d.%03d", (int)(secs / 3600), (int)((secs / 60) % 60),
                 (int)(secs % 60), (int)((l[i].vm_clock_nsec / 1000000) % 1000));
        if (l[i].icount != -1) {
            snprintf(ic, sizeof(ic), "%" PRId64, l[i].icount);
        }
        printf("%-9s %-16s %8s%20s%13s%11s\n", l[i].id, l[i].name, sz, date, clk, ic);
    }
}

/* Keys in the order qemu-img prints them. */
json_t *qk_tool_snapshots_json(const QkSnapshotInfo *l, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        json_t *o = json_object();
        if (l[i].icount != -1) {
            json_object_set_new(o, "icount", json_integer(l[i].icount));
        }
        json_object_set_new(o, "vm-clock-nsec", json_integer((json_int_t)(l[i].vm_clock_nsec % 1000000000)));
        json_object_set_new(o, "name", json_string(l[i].name));
        json_object_set_new(o, "date-sec", json_integer(l[i].date_sec));
        json_object_set_new(o, "date-nsec", json_integer(l[i].date_nsec));
        json_object_set_new(o, "vm-clock-sec", json_integer((json_int_t)(l[i].vm_clock_nsec / 1000000000)));
        json_object_set_new(o, "id", json_string(l[i].id));
        json_object_set_new(o, "vm-state-size", json_integer((json_int_t)l[i].vm_state_size));
        json_array_append_new(a, o);
    }
    return a;
}
