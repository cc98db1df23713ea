/*
 * liveness.c - which process a run belongs to, and whether that process is
 * gone (schema v5, runs.owner).
 *
 * A tuning run is recorded as 'running' when it starts and finished when
 * it ends; a run whose process was killed (SIGKILL, a crash, a reboot, a
 * job scheduler's time limit) never reaches its end. So that such a run
 * does not stay 'running' forever, ardb_run_begin records the process that
 * owns it, and every read-write open marks 'interrupted' the running runs
 * whose owner is certainly gone.
 *
 * The owner is "v1|MACHINE|BOOT|PIDNS|PID|START": the machine's id
 * (/etc/machine-id, else the host name), the boot id, the pid namespace,
 * the pid and the process's start time in clock ticks since boot
 * (/proc/PID/stat, field 22). A pid alone is not an identity: pids are
 * reused, so a process is the same one only when its start time matches
 * too, and only within the same boot. A run is decided only where that can
 * be done for certain: on the same machine (a reboot since means gone) and
 * in the same pid namespace (a container cannot see another's processes);
 * runs of other machines or namespaces, runs recorded before v5 (no owner)
 * and runs on systems without /proc stay as they are.
 */
#define _GNU_SOURCE /* readlink */
#include "liveness.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* The first line of a small file, without its newline; -1 if unreadable
 * or empty. */
static int read_line(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    size_t n;
    if (!f)
        return -1;
    if (!fgets(buf, (int)len, f)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    n = strcspn(buf, "\r\n");
    buf[n] = '\0';
    return n ? 0 : -1;
}

/* State and start time of a process from /proc/PID/stat: 0, or -1 with
 * *gone set when there is no such process. The command name (field 2) may
 * hold spaces and parentheses, so fields are counted after its last ')'. */
static int proc_stat(long pid, char *state, unsigned long long *start,
                     int *gone)
{
    char path[64], buf[1024];
    FILE *f;
    size_t n;
    const char *p;
    int field;

    *gone = 0;
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    f = fopen(path, "r");
    if (!f) {
        *gone = errno == ENOENT || errno == ESRCH;
        return -1;
    }
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return -1;
    p += 2;
    *state = *p;
    /* p is at field 3 (state); the start time is field 22. */
    for (field = 3; field < 22 && p; field++) {
        p = strchr(p, ' ');
        if (p)
            p++;
    }
    if (!p || sscanf(p, "%llu", start) != 1)
        return -1;
    return 0;
}

typedef struct identity {
    char machine[256], boot[64], pidns[64];
} identity;

static int self_identity(identity *id)
{
    ssize_t n;
    if (read_line("/etc/machine-id", id->machine, sizeof id->machine) != 0 &&
        gethostname(id->machine, sizeof id->machine - 1) != 0)
        return -1;
    id->machine[sizeof id->machine - 1] = '\0';
    if (read_line("/proc/sys/kernel/random/boot_id", id->boot,
                  sizeof id->boot) != 0)
        return -1;
    n = readlink("/proc/self/ns/pid", id->pidns, sizeof id->pidns - 1);
    if (n <= 0)
        return -1;
    id->pidns[n] = '\0';
    /* '|' separates the fields of an owner. */
    if (strchr(id->machine, '|') || strchr(id->boot, '|') ||
        strchr(id->pidns, '|'))
        return -1;
    return 0;
}

int ardb__owner_self(char *buf, size_t len)
{
    identity id;
    char state;
    unsigned long long start;
    int gone, n;
    long pid = (long)getpid();
    if (self_identity(&id) != 0 || proc_stat(pid, &state, &start, &gone) != 0)
        return -1;
    n = snprintf(buf, len, "v1|%s|%s|%s|%ld|%llu", id.machine, id.boot,
                 id.pidns, pid, start);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

int ardb__owner_gone(const char *owner)
{
    identity self;
    char machine[256], boot[64], pidns[64], state = 0;
    long pid;
    unsigned long long start, now_start;
    int gone, n = 0;

    if (!owner || self_identity(&self) != 0)
        return 0;
    if (sscanf(owner, "v1|%255[^|]|%63[^|]|%63[^|]|%ld|%llu%n", machine, boot,
               pidns, &pid, &start, &n) != 5 ||
        owner[n] != '\0' || pid <= 0)
        return 0; /* not an owner this build understands */
    if (strcmp(machine, self.machine) != 0)
        return 0; /* another machine: its processes cannot be seen */
    if (strcmp(boot, self.boot) != 0)
        return 1; /* this machine rebooted since: every process is gone */
    if (strcmp(pidns, self.pidns) != 0)
        return 0; /* another pid namespace (container) */
    if (proc_stat(pid, &state, &now_start, &gone) != 0)
        return gone;
    /* A zombie has exited; another start time is another process that was
     * given the same pid. */
    return state == 'Z' || state == 'X' || now_start != start;
}
