/*
 * test_db_open_paths.c - opening a tuning database where the path is odd:
 * a FIFO, a device, a FIFO beside the file in place of its write-ahead log
 * (each refused at once, never waited on), and a database in a directory
 * that cannot be written (read, through attnres_db_open and ardb_open).
 *
 * Every case runs under an alarm: a case that blocks is killed by SIGALRM,
 * which fails the program instead of hanging the suite.
 *
 * The read-only directory is made as a read-only mount makes it: as root,
 * in a child process with a mount namespace of its own, where the
 * directory is bind-mounted read-only; as another user, by clearing the
 * directory's write bits. Where neither works the case says why and is
 * skipped, and the program exits 77 (ctest's skip) unless a case failed.
 */
#define _GNU_SOURCE /* unshare, CLONE_NEWNS */
#include "check.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ardb_tools.h"
#include "attnres.h"
#include "test_db_run.h"
#include "test_scratch.h"

#define CASE_SECONDS 20

static char dir[256];

static void path_in(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", dir, name);
}

/* A tuning database in WAL mode with one device and one run. */
static int make_database(const char *path)
{
    ardb *db = NULL;
    char msg[512];
    int64_t dev_id = 0, run_id = 0;
    if (ardb_open(path, ARDB_CREATE, &db, msg, sizeof msg) != ARDB_DONE) {
        fprintf(stderr, "cannot create %s: %s\n", path, msg);
        return -1;
    }
    ardb_device dev = {"cpu", "Test CPU", "x86_64-test", "none", "test|fingerprint", 2, 1 << 30, 0};
    int rc = ardb_device_upsert(db, &dev, &dev_id);
    if (rc == ARDB_DONE && !(run_id = test_run_begin(db, dev_id)))
        rc = ARDB_EINVAL;
    if (rc == ARDB_DONE)
        rc = ardb_run_finish(db, run_id, "complete");
    if (rc != ARDB_DONE)
        fprintf(stderr, "cannot fill %s: %s\n", path, ardb_errmsg(db));
    ardb_close(db);
    return rc == ARDB_DONE ? 0 : -1;
}

static int count_row(void *ctx, int ncol, const char *const *names, const char *const *values)
{
    (void)ncol, (void)names, (void)values;
    ++*(int *)ctx;
    return 0;
}

/* A FIFO nobody writes: its open for reading blocks until a writer comes. */
static void test_fifo_is_refused_without_blocking(void)
{
    char fifo[600], msg[512] = "";
    path_in(fifo, sizeof fifo, "fifo.db");
    REQUIRE(mkfifo(fifo, 0600) == 0);
    attnres_db *db = (attnres_db *)1;
    CHECK(attnres_db_open(fifo, &db, msg, sizeof msg) == ATTNRES_EDB);
    CHECK(db == NULL);
    CHECK(strstr(msg, "not a regular file") && strstr(msg, fifo));
    /* The tuner's read-write open would create the file beside the FIFO's
     * name: it is refused too. */
    ardb *w = NULL;
    CHECK(ardb_open(fifo, ARDB_CREATE, &w, msg, sizeof msg) == ARDB_ENOTDB);
    CHECK(w == NULL && strstr(msg, "not a regular file"));
    unlink(fifo);
}

static void test_device_is_refused(void)
{
    char msg[512] = "";
    attnres_db *db = NULL;
    CHECK(attnres_db_open("/dev/zero", &db, msg, sizeof msg) == ATTNRES_EDB);
    CHECK(db == NULL && strstr(msg, "not a regular file"));
}

/* SQLite opens PATH-wal, PATH-shm and PATH-journal itself: a FIFO there
 * blocks it as the database would. */
static void test_fifo_beside_the_file_is_refused(void)
{
    char path[600], wal[700], msg[512] = "";
    path_in(path, sizeof path, "companion.db");
    REQUIRE(make_database(path) == 0);
    snprintf(wal, sizeof wal, "%s-wal", path);
    REQUIRE(mkfifo(wal, 0600) == 0);
    attnres_db *db = NULL;
    CHECK(attnres_db_open(path, &db, msg, sizeof msg) == ATTNRES_EDB);
    CHECK(strstr(msg, "not a regular file") && strstr(msg, wal));
    attnres_db_close(db);
    unlink(wal);
}

/* In a child: makes dir read-only to this process. Returns 0, or -1 with
 * the reason in why. */
static int make_dir_read_only(char *why, size_t len)
{
    if (geteuid() != 0) {
        if (chmod(dir, 0555) != 0) {
            snprintf(why, len, "chmod 0555 %s: %s", dir, strerror(errno));
            return -1;
        }
    } else if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
               mount(dir, dir, NULL, MS_BIND, NULL) != 0 ||
               mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) {
        snprintf(why, len, "root, but no read-only bind mount in a mount namespace of its own (%s)", strerror(errno));
        return -1;
    }
    if (access(dir, W_OK) == 0) {
        snprintf(why, len, "%s is still writable after making it read-only", dir);
        return -1;
    }
    return 0;
}

/* Runs fn in a child whose dir is read-only: 0 passed, 1 failed, 77 the
 * directory could not be made read-only (said why). */
static int in_read_only_dir(int (*fn)(const char *), const char *path)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        char why[1024];
        if (make_dir_read_only(why, sizeof why)) {
            printf("skip: cannot make a read-only directory here: %s\n", why);
            fflush(NULL);
            _exit(77);
        }
        _exit(fn(path));
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (geteuid() != 0)
        chmod(dir, 0700);
    if (!WIFEXITED(st)) {
        fprintf(stderr, "the child died of signal %d\n", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        return 1;
    }
    return WEXITSTATUS(st);
}

/* Cases skipped because the directory could not be made read-only. */
static int skips;

static int skipped(int rc)
{
    skips += rc == 77;
    return rc == 77;
}

static int read_database(const char *path)
{
    char msg[512] = "";
    attnres_db *db = NULL;
    int rc = attnres_db_open(path, &db, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "attnres_db_open(%s): %s\n", path, msg);
        return 1;
    }
    attnres_device *dev = NULL;
    attnres_plan *plan = NULL;
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 3);
    rc = attnres_device_open("cpu", &dev, msg, sizeof msg);
    if (rc == ATTNRES_OK)
        rc = attnres_plan_create(dev, db, &p, 0, &plan, msg, sizeof msg);
    if (rc != ATTNRES_OK)
        fprintf(stderr, "planning from %s: %s\n", path, msg);
    attnres_plan_destroy(plan);
    attnres_device_close(dev);
    attnres_db_close(db);
    /* The access layer reads its rows (attnres db show and the others). */
    ardb *a = NULL;
    int runs = 0;
    if (ardb_open(path, ARDB_READONLY, &a, msg, sizeof msg) != ARDB_DONE) {
        fprintf(stderr, "ardb_open(%s): %s\n", path, msg);
        return 1;
    }
    if (ardb_list_runs(a, count_row, &runs) != ARDB_DONE || runs != 1) {
        fprintf(stderr, "%s: %d runs listed (%s), 1 expected\n", path, runs, ardb_errmsg(a));
        rc = -1;
    }
    ardb_close(a);
    return rc == ATTNRES_OK ? 0 : 1;
}

/* The database is in WAL mode; SQLite cannot create its -shm file in the
 * read-only directory, which attnres_db_open must read all the same. */
static void test_read_only_directory_is_read(void)
{
    char path[600], shm[700];
    path_in(path, sizeof path, "ro.db");
    REQUIRE(make_database(path) == 0);
    snprintf(shm, sizeof shm, "%s-shm", path);
    REQUIRE(access(shm, F_OK) != 0); /* closed cleanly: no -wal, no -shm */
    int rc = in_read_only_dir(read_database, path);
    if (skipped(rc))
        return;
    CHECK(rc == 0);
}

static int refuses_unfolded_log(const char *path)
{
    char msg[512] = "";
    attnres_db *db = NULL;
    int rc = attnres_db_open(path, &db, msg, sizeof msg);
    attnres_db_close(db);
    if (rc != ATTNRES_EDB || !strstr(msg, "-wal")) {
        fprintf(stderr, "attnres_db_open(%s): status %d, message \"%s\"; EDB naming the -wal file expected\n", path,
                rc, msg);
        return 1;
    }
    return 0;
}

/* A write-ahead log that holds committed changes, without its -shm file,
 * in a read-only directory: reading the file alone would miss the changes,
 * so the open is refused with a message that names the log. */
static void test_unfolded_log_in_read_only_directory_is_refused(void)
{
    char path[600], shm[700];
    path_in(path, sizeof path, "unfolded.db");
    REQUIRE(make_database(path) == 0);
    /* A writer that dies before its connection closes leaves its log. */
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ardb *w = NULL;
        char msg[512];
        if (ardb_open(path, 0, &w, msg, sizeof msg) != ARDB_DONE)
            _exit(1);
        ardb_device dev = {"cpu", "Second CPU", "x86_64-test", "none", "test|second", 2, 1 << 30, 0};
        int64_t id;
        _exit(ardb_device_upsert(w, &dev, &id) == ARDB_DONE ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    REQUIRE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    snprintf(shm, sizeof shm, "%s-shm", path);
    unlink(shm);
    int rc = in_read_only_dir(refuses_unfolded_log, path);
    if (skipped(rc))
        return;
    CHECK(rc == 0);
}

static void cleanup(void)
{
    static const char *const names[] = {"ro.db", "unfolded.db", "companion.db", "fifo.db"};
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
    char p[800];
    if (!dir[0])
        return;
    chmod(dir, 0700);
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        for (size_t k = 0; k < sizeof suffix / sizeof *suffix; k++) {
            snprintf(p, sizeof p, "%s/%s%s", dir, names[i], suffix[k]);
            unlink(p);
        }
    rmdir(dir);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (!check_listing) {
        if (scratch_make("db-paths", dir, sizeof dir) != 0)
            return 1;
        atexit(cleanup);
    }
    /* SIGALRM's default action ends a case that blocks, and the program. */
    alarm(CASE_SECONDS);
    RUN_CASE(test_fifo_is_refused_without_blocking);
    alarm(CASE_SECONDS);
    RUN_CASE(test_device_is_refused);
    alarm(CASE_SECONDS);
    RUN_CASE(test_fifo_beside_the_file_is_refused);
    alarm(CASE_SECONDS);
    RUN_CASE(test_read_only_directory_is_read);
    alarm(CASE_SECONDS);
    RUN_CASE(test_unfolded_log_in_read_only_directory_is_refused);
    alarm(0);
    if (!check_listing && !check_failures && skips) {
        printf("%d case(s) skipped: see the skip lines above\n", skips);
        return check_exit_status(0) ? 2 : 77;
    }
    CHECK_EXIT();
}
