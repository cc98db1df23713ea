/*
 * ardb.c - connection handling, errors and the write side of the access
 * layer: devices, runs, problems, candidates, binaries, measurements.
 *
 * Library code: never prints, aborts or exits; every failure is a return
 * code plus a message in db->err.
 */
#include "ardb_internal.h"
#include "liveness.h"
#include "schema.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARDB_BUSY_TIMEOUT_MS 10000

/* ---- errors ------------------------------------------------------------ */

int ardb__fail(ardb *db, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(db->err, sizeof db->err, fmt, ap);
    va_end(ap);
    return code;
}

int ardb__map_rc(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_OK:
    case SQLITE_DONE:
    case SQLITE_ROW:
        return ARDB_DONE;
    case SQLITE_NOMEM:
        return ARDB_ENOMEM;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return ARDB_EBUSY;
    case SQLITE_READONLY:
        return ARDB_EREADONLY;
    case SQLITE_CONSTRAINT:
        return ARDB_EINVAL; /* unknown id, bad status: a caller's mistake */
    default:
        return ARDB_ESQL;
    }
}

int ardb__sql_fail(ardb *db, int rc, const char *what)
{
    return ardb__fail(db, ardb__map_rc(rc), "%s: %s", what,
                      sqlite3_errmsg(db->h));
}

const char *ardb_errmsg(const ardb *db)
{
    if (!db)
        return "no database handle";
    return db->err;
}

/* ---- statements and binding ---------------------------------------------- */

int ardb__stmt(ardb *db, int id, const char *sql, sqlite3_stmt **st)
{
    if (!db->stmts[id]) {
        int rc = sqlite3_prepare_v3(db->h, sql, -1, SQLITE_PREPARE_PERSISTENT,
                                    &db->stmts[id], NULL);
        if (rc != SQLITE_OK) {
            sqlite3_finalize(db->stmts[id]);
            db->stmts[id] = NULL;
            return ardb__sql_fail(db, rc, "cannot prepare a statement");
        }
    }
    *st = db->stmts[id];
    return ARDB_DONE;
}

void ardb__release(sqlite3_stmt *st)
{
    if (st) {
        (void)sqlite3_reset(st); /* the step's error was already reported */
        (void)sqlite3_clear_bindings(st);
    }
}

int ardb__check_writable(ardb *db)
{
    if (db->readonly)
        return ardb__fail(db, ARDB_EREADONLY, "%s is open read-only",
                          db->path);
    return ARDB_DONE;
}

char *ardb__col_dup(sqlite3_stmt *st, int col, int *oom)
{
    const unsigned char *t;
    int n;
    char *s;
    if (sqlite3_column_type(st, col) == SQLITE_NULL)
        return NULL;
    t = sqlite3_column_text(st, col);
    n = sqlite3_column_bytes(st, col);
    if (!t) {
        *oom = 1;
        return NULL;
    }
    s = malloc((size_t)n + 1);
    if (!s) {
        *oom = 1;
        return NULL;
    }
    memcpy(s, t, (size_t)n);
    s[n] = '\0';
    return s;
}

double ardb__col_double(sqlite3_stmt *st, int col)
{
    if (sqlite3_column_type(st, col) == SQLITE_NULL)
        return NAN;
    return sqlite3_column_double(st, col);
}

void ardb__bind_text(ardb_binder *b, const char *s)
{
    int i = ++b->i;
    if (b->rc != SQLITE_OK)
        return;
    b->rc = s ? sqlite3_bind_text(b->st, i, s, -1, SQLITE_STATIC)
              : sqlite3_bind_null(b->st, i);
}

void ardb__bind_int64(ardb_binder *b, int64_t v)
{
    int i = ++b->i;
    if (b->rc == SQLITE_OK)
        b->rc = sqlite3_bind_int64(b->st, i, v);
}

void ardb__bind_id(ardb_binder *b, int64_t id)
{
    int i = ++b->i;
    if (b->rc != SQLITE_OK)
        return;
    b->rc = id > 0 ? sqlite3_bind_int64(b->st, i, id)
                   : sqlite3_bind_null(b->st, i);
}

void ardb__bind_double(ardb_binder *b, double v)
{
    int i = ++b->i;
    if (b->rc == SQLITE_OK) /* NaN is stored as NULL */
        b->rc = isnan(v) ? sqlite3_bind_null(b->st, i)
                         : sqlite3_bind_double(b->st, i, v);
}

void ardb__bind_blob(ardb_binder *b, const void *p, size_t n)
{
    int i = ++b->i;
    if (b->rc != SQLITE_OK)
        return;
    if (n == 0 || !p)
        b->rc = sqlite3_bind_zeroblob(b->st, i, 0);
    else
        b->rc = sqlite3_bind_blob64(b->st, i, p, (sqlite3_uint64)n,
                                    SQLITE_STATIC);
}

/* ---- open / close --------------------------------------------------------- */

static void copy_msg(char *msg, size_t msg_len, const char *text)
{
    if (msg && msg_len) {
        size_t n = strlen(text);
        if (n >= msg_len)
            n = msg_len - 1;
        memcpy(msg, text, n);
        msg[n] = '\0';
    }
}

/* Runs a statement that needs no values and may return rows (PRAGMA). */
static int exec_pragma(ardb *db, const char *sql)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__fail(db, ardb__map_rc(rc), "%s: %s", sql,
                          sqlite3_errmsg(db->h));
    return ARDB_DONE;
}

/* Reads the file's first page so that a non-SQLite file is refused before
 * anything is written to it. *sqlite_rc receives SQLite's own answer. */
static int probe(ardb *db, int *sqlite_rc)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, "SELECT count(*) FROM sqlite_schema",
                                -1, &st, NULL);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            rc = SQLITE_OK;
    }
    *sqlite_rc = rc;
    if (rc != SQLITE_OK) {
        int prim = rc & 0xff, code;
        if (prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT)
            code = ardb__fail(db, ARDB_ENOTDB,
                              "%s is not an SQLite database (%s)", db->path,
                              sqlite3_errmsg(db->h));
        else
            code = ardb__fail(db, ardb__map_rc(rc), "cannot read %s: %s",
                              db->path, sqlite3_errmsg(db->h));
        sqlite3_finalize(st);
        return code;
    }
    sqlite3_finalize(st);
    return ARDB_DONE;
}

/* The current journal mode into buf ("wal", "delete", ...). */
static int journal_mode(ardb *db, const char *sql, char *buf, size_t len)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    buf[0] = '\0';
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            if (t)
                snprintf(buf, len, "%s", (const char *)t);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(st);
    return rc;
}

/* Switches the file to WAL (persistent in the file). The switch needs an
 * exclusive lock and SQLite does not always run the busy handler for it,
 * so a busy answer is retried here until the busy timeout. */
static int set_wal(ardb *db)
{
    char mode[32];
    int waited = 0, rc;
    rc = journal_mode(db, "PRAGMA journal_mode", mode, sizeof mode);
    if (rc == SQLITE_OK && !strcmp(mode, "wal"))
        return ARDB_DONE;
    for (;;) {
        rc = journal_mode(db, "PRAGMA journal_mode = WAL", mode, sizeof mode);
        if (rc == SQLITE_OK)
            return ARDB_DONE; /* "wal", or a mode the file system forces */
        if (((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) ||
            waited >= ARDB_BUSY_TIMEOUT_MS)
            return ardb__fail(db, ardb__map_rc(rc),
                              "cannot switch %s to WAL: %s", db->path,
                              sqlite3_errmsg(db->h));
        waited += sqlite3_sleep(5 + waited / 50);
    }
}

/* The most runs one open marks; any others are marked by the next. */
#define MAX_MARKED_RUNS 256

/* Marks 'interrupted' every running run whose owning process is gone (see
 * ardb_open). Best effort: a failure leaves the runs to the next read-write
 * open and does not fail this one, since a busy file is no reason to refuse
 * a tuner its database. */
static void mark_interrupted_runs(ardb *db)
{
    sqlite3_stmt *st = NULL;
    int64_t ids[MAX_MARKED_RUNS];
    size_t n = 0, i;
    int rc;

    /* Read first, without a write lock: usually no run is left running. */
    rc = sqlite3_prepare_v2(db->h,
                            "SELECT id, owner FROM runs WHERE status = "
                            "'running' AND owner IS NOT NULL ORDER BY id",
                            -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW &&
           n < MAX_MARKED_RUNS) {
        rc = SQLITE_OK;
        if (ardb__owner_gone((const char *)sqlite3_column_text(st, 1)))
            ids[n++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (n == 0)
        return;
    if (sqlite3_exec(db->h, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return;
    /* "AND status = 'running'": another process may have decided the run
     * (or the run itself finished) since it was read. finished_at stays
     * NULL: when the process ended is not known. */
    rc = sqlite3_prepare_v2(db->h,
                            "UPDATE runs SET status = 'interrupted' WHERE id "
                            "= ? AND status = 'running'",
                            -1, &st, NULL);
    for (i = 0; rc == SQLITE_OK && i < n; i++) {
        rc = sqlite3_bind_int64(st, 1, ids[i]);
        if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK ||
        sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        (void)sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
}

/* The companions SQLite opens beside a database file. */
static const char *const companion_suffix[] = {"-wal", "-shm", "-journal"};

/* Refuses, before SQLite opens anything, what is not a regular file: the
 * open of a FIFO blocks until a writer comes and a device never ends, and
 * SQLite opens the file and its companions without O_NONBLOCK. stat never
 * opens the file, so this never blocks. */
static int check_file_kinds(ardb *db, int create)
{
    struct stat sb;
    char companion[4096];
    size_t i;

    if (stat(db->path, &sb) != 0) {
        if (errno == ENOENT && !create)
            return ardb__fail(db, ARDB_ENOTDB, "no such database file: %s",
                              db->path);
    } else if (S_ISDIR(sb.st_mode)) {
        return ardb__fail(db, ARDB_ENOTDB, "%s is a directory, not a database",
                          db->path);
    } else if (!S_ISREG(sb.st_mode)) {
        return ardb__fail(db, ARDB_ENOTDB,
                          "%s is not a regular file (a FIFO, device or "
                          "socket), so it is not a database",
                          db->path);
    }
    for (i = 0; i < sizeof companion_suffix / sizeof *companion_suffix; i++) {
        snprintf(companion, sizeof companion, "%s%s", db->path,
                 companion_suffix[i]);
        if (stat(companion, &sb) == 0 && !S_ISREG(sb.st_mode))
            return ardb__fail(db, ARDB_ENOTDB,
                              "%s is not a regular file, so SQLite cannot "
                              "use it beside the database %s",
                              companion, db->path);
    }
    return ARDB_DONE;
}

/* 1 when this process cannot create files in the directory of path. A
 * relative path is taken from the working directory's name, as SQLite
 * takes it: the directory reached by name may be a read-only mount over
 * the one the process entered. */
static int directory_read_only(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096] = ".";
    size_t used = 0;
    if (path[0] != '/' && getcwd(dir, sizeof dir - 2)) {
        used = strlen(dir);
        dir[used++] = '/';
        dir[used] = '\0';
    }
    if (!slash)
        snprintf(dir + used, sizeof dir - used, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir + used, sizeof dir - used, "%.*s", (int)(slash - path),
                 path);
    return access(dir, W_OK) != 0;
}

/* "file:PATH?immutable=1" with PATH percent-encoded, malloc'ed. */
static char *immutable_uri(const char *path)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = strlen(path);
    char *uri = malloc(3 * n + 32), *o = uri;
    if (!uri)
        return NULL;
    /* "file://" and an empty authority before an absolute path, so that a
     * path starting with two slashes is not taken for an authority. */
    const char *scheme = path[0] == '/' ? "file://" : "file:";
    strcpy(o, scheme);
    o += strlen(scheme);
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
            (*p >= '0' && *p <= '9') || strchr("/-._~", *p)) {
            *o++ = (char)*p;
        } else {
            *o++ = '%';
            *o++ = hex[*p >> 4];
            *o++ = hex[*p & 15];
        }
    }
    strcpy(o, "?immutable=1");
    return uri;
}

/* A read-only connection to a WAL database needs the -shm file, which
 * SQLite cannot create in a directory this process cannot write (a
 * read-only mount, a directory of another user): it answers "unable to
 * open database file". The file can then be read as immutable, which
 * SQLite reads without the -shm file and without locks. That is right only
 * while nobody writes the file: nobody can where the directory is
 * read-only to everyone, since a writer must create the -wal file beside
 * it; a user who can write there must not tune into it meanwhile (see
 * attnres_db_open). A -wal file that holds changes is refused instead:
 * the immutable reader would not see them. Returns 1 when the connection
 * may be reopened that way, 0 with the message set when not. */
static int may_read_immutable(ardb *db, int probe_rc)
{
    char wal[4096];
    struct stat sb;
    int prim = probe_rc & 0xff;
    if (!db->readonly || (prim != SQLITE_CANTOPEN && prim != SQLITE_READONLY) ||
        !directory_read_only(db->path))
        return 0;
    snprintf(wal, sizeof wal, "%s-wal", db->path);
    if (stat(wal, &sb) == 0 && sb.st_size > 0) {
        ardb__fail(db, ARDB_ESQL,
                   "cannot read %s: its directory cannot be written here "
                   "and %s holds changes not yet in the file; open it once "
                   "where the directory can be written",
                   db->path, wal);
        return 0;
    }
    return 1;
}

/* Opens db->h (name is a path, or a URI with SQLITE_OPEN_URI in oflags)
 * and configures the connection. */
static int open_handle(ardb *db, const char *name, int oflags, int create)
{
    struct stat sb;
    int rc = sqlite3_open_v2(name, &db->h, oflags, NULL);
    if (rc != SQLITE_OK) {
        if (!db->h)
            return ardb__fail(db, ARDB_ENOMEM, "out of memory opening %s",
                              db->path);
        if ((rc & 0xff) == SQLITE_CANTOPEN && !create &&
            stat(db->path, &sb) != 0 && errno == ENOENT)
            return ardb__fail(db, ARDB_ENOTDB, "no such database file: %s",
                              db->path);
        return ardb__fail(db, ardb__map_rc(rc), "cannot open %s: %s",
                          db->path, sqlite3_errmsg(db->h));
    }
    if ((rc = sqlite3_extended_result_codes(db->h, 1)) != SQLITE_OK ||
        (rc = sqlite3_busy_timeout(db->h, ARDB_BUSY_TIMEOUT_MS)) != SQLITE_OK ||
        (rc = sqlite3_db_config(db->h, SQLITE_DBCONFIG_DEFENSIVE, 1,
                                (int *)NULL)) != SQLITE_OK ||
        (rc = sqlite3_db_config(db->h, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0,
                                (int *)NULL)) != SQLITE_OK)
        return ardb__sql_fail(db, rc, "cannot configure the connection");
    return ARDB_DONE;
}

static int open_connection(ardb *db, unsigned flags)
{
    int create = (flags & ARDB_CREATE) != 0;
    int oflags, code, probe_rc = SQLITE_OK;

    if ((code = check_file_kinds(db, create)))
        return code;
    oflags = db->readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE;
    if (create)
        oflags |= SQLITE_OPEN_CREATE;
    if ((code = open_handle(db, db->path, oflags, create)))
        return code;
    /* Nothing touches the file before the probe has read it. */
    if ((code = probe(db, &probe_rc))) {
        char *uri;
        if (!may_read_immutable(db, probe_rc))
            return code;
        sqlite3_close_v2(db->h);
        db->h = NULL;
        if (!(uri = immutable_uri(db->path)))
            return ardb__fail(db, ARDB_ENOMEM, "out of memory opening %s",
                              db->path);
        code = open_handle(db, uri, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, 0);
        free(uri);
        if (code || (code = probe(db, &probe_rc)))
            return code;
    }
    if ((code = exec_pragma(db, "PRAGMA foreign_keys = ON")))
        return code;
    if (!db->readonly) {
        if ((code = set_wal(db)) ||
            (code = exec_pragma(db, "PRAGMA synchronous = NORMAL")))
            return code;
    }
    if ((code = ardb__schema_init(db, create)))
        return code;
    if (!db->readonly)
        mark_interrupted_runs(db);
    return ARDB_DONE;
}

static char *dup_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int ardb_open(const char *path, unsigned flags, ardb **out, char *msg,
              size_t msg_len)
{
    ardb *db;
    int code;

    if (out)
        *out = NULL;
    if (!path || !out || !*path || (flags & ~(ARDB_READONLY | ARDB_CREATE)) ||
        ((flags & ARDB_READONLY) && (flags & ARDB_CREATE))) {
        copy_msg(msg, msg_len, "ardb_open: invalid argument");
        return ARDB_EINVAL;
    }
    db = calloc(1, sizeof *db);
    if (!db || !(db->path = dup_string(path))) {
        free(db);
        copy_msg(msg, msg_len, "out of memory");
        return ARDB_ENOMEM;
    }
    db->readonly = (flags & ARDB_READONLY) != 0;
    code = open_connection(db, flags);
    if (code != ARDB_DONE) {
        copy_msg(msg, msg_len, db->err);
        ardb_close(db);
        return code;
    }
    db->err[0] = '\0';
    *out = db;
    return ARDB_DONE;
}

void ardb_close(ardb *db)
{
    int i;
    if (!db)
        return;
    for (i = 0; i < ST_COUNT; i++)
        sqlite3_finalize(db->stmts[i]);
    /* Rolls back an open transaction; close_v2 never fails on a handle
     * whose statements are all finalized. */
    sqlite3_close_v2(db->h);
    free(db->path);
    free(db);
}

/* ---- transactions ------------------------------------------------------- */

static int exec_tx(ardb *db, const char *sql)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__fail(db, ardb__map_rc(rc), "%s failed: %s", sql,
                          sqlite3_errmsg(db->h));
    return ARDB_DONE;
}

int ardb_begin(ardb *db)
{
    if (!db)
        return ARDB_EINVAL;
    /* IMMEDIATE: a writer takes the lock up front (through the busy
     * timeout) instead of failing when a read upgrades. */
    return exec_tx(db, db->readonly ? "BEGIN DEFERRED" : "BEGIN IMMEDIATE");
}

int ardb_commit(ardb *db)
{
    if (!db)
        return ARDB_EINVAL;
    return exec_tx(db, "COMMIT");
}

int ardb_rollback(ardb *db)
{
    if (!db)
        return ARDB_EINVAL;
    if (sqlite3_get_autocommit(db->h))
        return ARDB_DONE; /* nothing open (or SQLite already rolled back) */
    return exec_tx(db, "ROLLBACK");
}

/* ---- shared helpers ----------------------------------------------------- */

/* Steps an INSERT/UPDATE to completion. */
static int step_done(ardb *db, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    int code = ARDB_DONE;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
}

/* Steps a one-column id SELECT. */
static int step_id(ardb *db, sqlite3_stmt *st, const char *what, int64_t *id)
{
    int rc = sqlite3_step(st);
    int code = ARDB_DONE;
    if (rc == SQLITE_ROW)
        *id = sqlite3_column_int64(st, 0);
    else if (rc == SQLITE_DONE)
        code = ardb__fail(db, ARDB_ENOTFOUND, "%s: no such row", what);
    else
        code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
}

static int bind_fail(ardb *db, sqlite3_stmt *st, int rc, const char *what)
{
    int code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
}

/* INSERT ... ON CONFLICT DO NOTHING, then SELECT the id: race-free across
 * processes because rows are never deleted. */
#define UPSERT_ID(db, ins, sel, what, id)                                     \
    do {                                                                      \
        int c_ = step_done((db), (ins), (what));                              \
        if (c_)                                                               \
            return c_;                                                        \
        return step_id((db), (sel), (what), (id));                            \
    } while (0)

/* ---- devices -------------------------------------------------------------- */

int ardb_device_upsert(ardb *db, const ardb_device *dev, int64_t *id)
{
    /* A device is (fingerprint, simulated): the same fingerprint recorded
     * by a simulated driver and by hardware names two devices, so that
     * nothing measured on one is ever taken for the other. */
    static const char ins_sql[] =
        "INSERT INTO devices(backend, name, arch, units, memory, driver,"
        " fingerprint, simulated, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")"
        " ON CONFLICT(fingerprint, simulated) DO NOTHING";
    static const char sel_sql[] =
        "SELECT id FROM devices WHERE fingerprint = ? AND simulated = ?";
    sqlite3_stmt *ins, *sel;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!dev || !id || !dev->backend || !dev->fingerprint)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_device_upsert: backend and fingerprint are "
                          "required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_DEVICE_INSERT, ins_sql, &ins)) ||
        (code = ardb__stmt(db, ST_DEVICE_SELECT, sel_sql, &sel)))
        return code;
    b = (ardb_binder){ins, SQLITE_OK, 0};
    ardb__bind_text(&b, dev->backend);
    ardb__bind_text(&b, dev->name);
    ardb__bind_text(&b, dev->arch);
    ardb__bind_int64(&b, dev->units);
    ardb__bind_int64(&b, dev->memory);
    ardb__bind_text(&b, dev->driver);
    ardb__bind_text(&b, dev->fingerprint);
    ardb__bind_int64(&b, dev->simulated ? 1 : 0);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, ins, b.rc, "device upsert");
    b = (ardb_binder){sel, SQLITE_OK, 0};
    ardb__bind_text(&b, dev->fingerprint);
    ardb__bind_int64(&b, dev->simulated ? 1 : 0);
    if (b.rc != SQLITE_OK) {
        ardb__release(ins);
        return bind_fail(db, sel, b.rc, "device upsert");
    }
    UPSERT_ID(db, ins, sel, "device upsert", id);
}

/* ---- runs ------------------------------------------------------------------ */

int ardb_run_begin(ardb *db, const ardb_run *run, int64_t *run_id)
{
    static const char sql[] =
        "INSERT INTO runs(started_at, status, user, host, command,"
        " project_version, templates_hash, compiler, driver, device_id,"
        " policy_json, strategy, copy_gbps, launch_us, read_gbps, owner)"
        " VALUES(" ARDB_NOW ", 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
        " ?, ?)";
    char owner[512];
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!run || !run_id)
        return ardb__fail(db, ARDB_EINVAL, "ardb_run_begin: invalid argument");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_RUN_INSERT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, run->user);
    ardb__bind_text(&b, run->host);
    ardb__bind_text(&b, run->command);
    ardb__bind_text(&b, run->project_version);
    ardb__bind_text(&b, run->templates_hash);
    ardb__bind_text(&b, run->compiler);
    ardb__bind_text(&b, run->driver);
    ardb__bind_id(&b, run->device_id);
    ardb__bind_text(&b, run->policy_json);
    ardb__bind_text(&b, run->strategy);
    ardb__bind_double(&b, run->copy_gbps);
    ardb__bind_double(&b, run->launch_us);
    /* Not measured (NaN, or 0 from a caller that zero-initializes the
     * struct and predates the field) is NULL, never a zero roofline. */
    ardb__bind_double(&b, isfinite(run->read_gbps) && run->read_gbps > 0
                              ? run->read_gbps
                              : NAN);
    /* Without an owner (no /proc) the run is never marked interrupted by
     * another process: nothing could tell that this one is gone. */
    ardb__bind_text(&b, ardb__owner_self(owner, sizeof owner) == 0 ? owner
                                                                    : NULL);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, "run begin");
    /* The rowid is read before the statement is reset: same connection. */
    {
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE) {
            code = ardb__sql_fail(db, rc, "run begin");
            ardb__release(st);
            return code;
        }
        *run_id = sqlite3_last_insert_rowid(db->h);
        ardb__release(st);
    }
    return ARDB_DONE;
}

int ardb_run_finish(ardb *db, int64_t run_id, const char *status)
{
    static const char sql[] =
        "UPDATE runs SET status = ?, finished_at = " ARDB_NOW " WHERE id = ?";
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!status || (strcmp(status, "complete") && strcmp(status, "failed") &&
                    strcmp(status, "interrupted")))
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_run_finish: status must be complete, failed "
                          "or interrupted");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_RUN_FINISH, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, status);
    ardb__bind_int64(&b, run_id);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, "run finish");
    if ((code = step_done(db, st, "run finish")))
        return code;
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    return ARDB_DONE;
}

/* Sets one JSON column of a run (the column and statement are fixed by the
 * callers below, never from input). */
static int run_set_json(ardb *db, int stmt, const char *sql, const char *what, int64_t run_id, const char *json)
{
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!json || json[0] != '{')
        return ardb__fail(db, ARDB_EINVAL, "recording the run's %s: it must be a JSON object", what);
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, stmt, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, json);
    ardb__bind_int64(&b, run_id);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, what);
    if ((code = step_done(db, st, what)))
        return code;
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    return ARDB_DONE;
}

int ardb_run_set_ceilings(ardb *db, int64_t run_id, const char *json)
{
    return run_set_json(db, ST_RUN_CEILINGS, "UPDATE runs SET ceilings = ? WHERE id = ?", "ceilings", run_id,
                        json);
}

int ardb_run_set_stages(ardb *db, int64_t run_id, const char *json)
{
    return run_set_json(db, ST_RUN_STAGES, "UPDATE runs SET stages = ? WHERE id = ?", "stages", run_id, json);
}

/* ---- problems --------------------------------------------------------------- */

void ardb_problem_key(const ardb_problem *p, char *buf, size_t len)
{
    if (!buf || !len)
        return;
    if (!p) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, len, "%s:%s:d%" PRId64 ":n%" PRId32 ":h%" PRId32
             ":%s:epi%" PRId32 ":s%" PRId32 ":t%" PRId64,
             p->op ? p->op : "?", p->dtype ? p->dtype : "?", p->d, p->n,
             p->heads, p->form ? p->form : "?", p->epilogue, p->s,
             p->t_bucket);
}

int ardb_problem_upsert(ardb *db, const ardb_problem *p, int64_t *id)
{
    static const char ins_sql[] =
        "INSERT INTO problems(key, op, dtype, form, d, n, heads, epilogue, s,"
        " t_bucket) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(key) DO NOTHING";
    static const char sel_sql[] = "SELECT id FROM problems WHERE key = ?";
    char key[256];
    sqlite3_stmt *ins, *sel;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!p || !id || !p->op || !p->dtype || !p->form)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_problem_upsert: op, dtype and form are "
                          "required");
    ardb_problem_key(p, key, sizeof key);
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_PROBLEM_INSERT, ins_sql, &ins)) ||
        (code = ardb__stmt(db, ST_PROBLEM_SELECT, sel_sql, &sel)))
        return code;
    b = (ardb_binder){ins, SQLITE_OK, 0};
    ardb__bind_text(&b, key);
    ardb__bind_text(&b, p->op);
    ardb__bind_text(&b, p->dtype);
    ardb__bind_text(&b, p->form);
    ardb__bind_int64(&b, p->d);
    ardb__bind_int64(&b, p->n);
    ardb__bind_int64(&b, p->heads);
    ardb__bind_int64(&b, p->epilogue);
    ardb__bind_int64(&b, p->s);
    ardb__bind_int64(&b, p->t_bucket);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, ins, b.rc, "problem upsert");
    b = (ardb_binder){sel, SQLITE_OK, 0};
    ardb__bind_text(&b, key);
    if (b.rc != SQLITE_OK) {
        ardb__release(ins);
        return bind_fail(db, sel, b.rc, "problem upsert");
    }
    UPSERT_ID(db, ins, sel, "problem upsert", id);
}

/* ---- candidates ---------------------------------------------------------------- */

int ardb_candidate_upsert(ardb *db, const ardb_candidate *c, int64_t *id)
{
    static const char ins_sql[] =
        "INSERT INTO candidates(backend, template_name, variant, params_json,"
        " source_hash, source, kernel_name, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")"
        " ON CONFLICT(variant, source_hash) DO NOTHING";
    static const char sel_sql[] =
        "SELECT id FROM candidates WHERE variant = ? AND source_hash = ?";
    sqlite3_stmt *ins, *sel;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!c || !id || !c->variant || !c->source_hash)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_candidate_upsert: variant and source_hash are "
                          "required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_CANDIDATE_INSERT, ins_sql, &ins)) ||
        (code = ardb__stmt(db, ST_CANDIDATE_SELECT, sel_sql, &sel)))
        return code;
    b = (ardb_binder){ins, SQLITE_OK, 0};
    ardb__bind_text(&b, c->backend);
    ardb__bind_text(&b, c->template_name);
    ardb__bind_text(&b, c->variant);
    ardb__bind_text(&b, c->params_json);
    ardb__bind_text(&b, c->source_hash);
    ardb__bind_text(&b, c->source);
    ardb__bind_text(&b, c->kernel_name);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, ins, b.rc, "candidate upsert");
    b = (ardb_binder){sel, SQLITE_OK, 0};
    ardb__bind_text(&b, c->variant);
    ardb__bind_text(&b, c->source_hash);
    if (b.rc != SQLITE_OK) {
        ardb__release(ins);
        return bind_fail(db, sel, b.rc, "candidate upsert");
    }
    UPSERT_ID(db, ins, sel, "candidate upsert", id);
}

/* ---- binaries ------------------------------------------------------------------ */

int ardb_binary_put(ardb *db, const ardb_binary *bin)
{
    static const char sql[] =
        "INSERT INTO binaries(build_key, candidate_id, compiler, options,"
        " target, blob, resources_json, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")"
        " ON CONFLICT(build_key) DO NOTHING";
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!bin || !bin->build_key || (bin->size && !bin->blob))
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_binary_put: build_key and blob are required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_BINARY_INSERT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, bin->build_key);
    ardb__bind_id(&b, bin->candidate_id);
    ardb__bind_text(&b, bin->compiler);
    ardb__bind_text(&b, bin->options);
    ardb__bind_text(&b, bin->target);
    ardb__bind_blob(&b, bin->blob, bin->size);
    ardb__bind_text(&b, bin->resources_json);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, "binary put");
    return step_done(db, st, "binary put");
}

int ardb_binary_get(ardb *db, const char *build_key, void **blob, size_t *size)
{
    static const char sql[] = "SELECT blob FROM binaries WHERE build_key = ?";
    sqlite3_stmt *st;
    ardb_binder b;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!build_key || !blob || !size)
        return ardb__fail(db, ARDB_EINVAL, "ardb_binary_get: invalid argument");
    *blob = NULL;
    *size = 0;
    if ((code = ardb__stmt(db, ST_BINARY_SELECT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, build_key);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, "binary get");
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const void *p = sqlite3_column_blob(st, 0);
        int n = sqlite3_column_bytes(st, 0);
        if (!p && n > 0) {
            code = ardb__fail(db, ARDB_ENOMEM, "binary get: out of memory");
        } else {
            /* At least one byte so that a found empty blob is not NULL. */
            void *copy = malloc(n > 0 ? (size_t)n : 1);
            if (!copy) {
                code = ardb__fail(db, ARDB_ENOMEM, "binary get: out of memory");
            } else {
                if (n > 0)
                    memcpy(copy, p, (size_t)n);
                *blob = copy;
                *size = (size_t)n;
            }
        }
    } else if (rc == SQLITE_DONE) {
        code = ardb__fail(db, ARDB_ENOTFOUND, "no binary with build key %s",
                          build_key);
    } else {
        code = ardb__sql_fail(db, rc, "binary get");
    }
    ardb__release(st);
    return code;
}

/* ---- measurements ----------------------------------------------------------------- */

static const char *const status_names[] = {
    "ok", "compile_failed", "launch_failed", "wrong_result", "skipped",
    "timeout"};
#define N_STATUS (sizeof status_names / sizeof status_names[0])

const char *ardb_status_name(ardb_status s)
{
    if ((unsigned)s < N_STATUS)
        return status_names[s];
    return "unknown";
}

static int status_from_name(const char *name, ardb_status *s)
{
    size_t i;
    for (i = 0; name && i < N_STATUS; i++)
        if (!strcmp(name, status_names[i])) {
            *s = (ardb_status)i;
            return 1;
        }
    return 0;
}

int ardb_measurement_add(ardb *db, const ardb_measurement *m, int64_t *id)
{
    static const char sql[] =
        "INSERT INTO measurements(run_id, candidate_id, problem_id, device_id,"
        " build_key, status, median_us, min_us, max_us, spread_us, reps, gbps,"
        " roofline, rel_err, message, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")";
    sqlite3_stmt *st;
    ardb_binder b;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!m || (unsigned)m->status >= N_STATUS || m->run_id <= 0 ||
        m->candidate_id <= 0 || m->problem_id <= 0 || m->device_id <= 0)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_measurement_add: ids and a valid status are "
                          "required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_MEASUREMENT_INSERT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_int64(&b, m->run_id);
    ardb__bind_int64(&b, m->candidate_id);
    ardb__bind_int64(&b, m->problem_id);
    ardb__bind_int64(&b, m->device_id);
    ardb__bind_text(&b, m->build_key);
    ardb__bind_text(&b, status_names[m->status]);
    ardb__bind_double(&b, m->median_us);
    ardb__bind_double(&b, m->min_us);
    ardb__bind_double(&b, m->max_us);
    ardb__bind_double(&b, m->spread_us);
    ardb__bind_int64(&b, m->reps);
    ardb__bind_double(&b, m->gbps);
    ardb__bind_double(&b, m->roofline);
    ardb__bind_double(&b, m->rel_err);
    ardb__bind_text(&b, m->message);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, "measurement add");
    rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) {
        code = ardb__sql_fail(db, rc, "measurement add");
        ardb__release(st);
        return code;
    }
    if (id)
        *id = sqlite3_last_insert_rowid(db->h);
    ardb__release(st);
    return ARDB_DONE;
}

int ardb_measurement_find(ardb *db, int64_t candidate_id, int64_t problem_id,
                          int64_t device_id, const char *build_key,
                          ardb_measurement *m)
{
    return ardb_measurement_find_ex(db, candidate_id, problem_id, device_id,
                                    build_key, m, NULL);
}

int ardb_measurement_find_ex(ardb *db, int64_t candidate_id,
                             int64_t problem_id, int64_t device_id,
                             const char *build_key, ardb_measurement *m,
                             int64_t *measurement_id)
{
    static const char sql[] =
        "SELECT id, run_id, status, median_us, min_us, max_us, spread_us,"
        " reps, gbps, roofline, rel_err, message, build_key"
        " FROM measurements"
        " WHERE candidate_id = ? AND problem_id = ? AND device_id = ?"
        " AND build_key IS ?"
        " ORDER BY id DESC LIMIT 1";
    sqlite3_stmt *st;
    ardb_binder b;
    int code = ARDB_DONE, rc, oom = 0;

    if (!db)
        return ARDB_EINVAL;
    if (!m)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_measurement_find: invalid argument");
    memset(m, 0, sizeof *m);
    if ((code = ardb__stmt(db, ST_MEASUREMENT_FIND, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_int64(&b, candidate_id);
    ardb__bind_int64(&b, problem_id);
    ardb__bind_int64(&b, device_id);
    ardb__bind_text(&b, build_key);
    if (b.rc != SQLITE_OK)
        return bind_fail(db, st, b.rc, "measurement find");
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        ardb_status s = ARDB_STATUS_OK;
        const char *sname = (const char *)sqlite3_column_text(st, 2);
        m->candidate_id = candidate_id;
        m->problem_id = problem_id;
        m->device_id = device_id;
        m->run_id = sqlite3_column_int64(st, 1);
        if (measurement_id)
            *measurement_id = sqlite3_column_int64(st, 0);
        if (!status_from_name(sname, &s))
            code = ardb__fail(db, ARDB_ESQL,
                              "measurement find: unknown status '%s'",
                              sname ? sname : "(null)");
        m->status = s;
        m->median_us = ardb__col_double(st, 3);
        m->min_us = ardb__col_double(st, 4);
        m->max_us = ardb__col_double(st, 5);
        m->spread_us = ardb__col_double(st, 6);
        m->reps = (int32_t)sqlite3_column_int64(st, 7);
        m->gbps = ardb__col_double(st, 8);
        m->roofline = ardb__col_double(st, 9);
        m->rel_err = ardb__col_double(st, 10);
        m->message = ardb__col_dup(st, 11, &oom);
        m->build_key = ardb__col_dup(st, 12, &oom);
        if (oom && !code)
            code = ardb__fail(db, ARDB_ENOMEM,
                              "measurement find: out of memory");
        if (code)
            ardb_measurement_clear(m);
    } else if (rc == SQLITE_DONE) {
        code = ardb__fail(db, ARDB_ENOTFOUND, "no such measurement");
    } else {
        code = ardb__sql_fail(db, rc, "measurement find");
    }
    ardb__release(st);
    return code;
}

void ardb_measurement_clear(ardb_measurement *m)
{
    if (!m)
        return;
    free((char *)m->build_key);
    free((char *)m->message);
    memset(m, 0, sizeof *m);
}
