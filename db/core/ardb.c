/*
 * ardb.c - the connection (open, close, errors, the statement cache and
 * the binding helpers every part of db/ uses) and the binaries a plan
 * loads. The writes of a tuning run are db/write's.
 *
 * Library code: never prints, aborts or exits; every failure is a return
 * code plus a message in db->err.
 */
#include "ardb_internal.h"
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

int ardb__stmt_for_version(ardb *db, int64_t version, const ardb_stmt_form *forms, size_t n, sqlite3_stmt **st)
{
    size_t i = 0;
    while (i + 1 < n && forms[i].since > version)
        i++;
    return ardb__stmt(db, forms[i].id, forms[i].sql, st);
}

int ardb__stmt_for_schema(ardb *db, const ardb_stmt_form *forms, size_t n, sqlite3_stmt **st)
{
    int64_t version = 0;
    const int code = ardb__user_version(db, "main", &version);
    return code ? code : ardb__stmt_for_version(db, version, forms, n, st);
}

int ardb__stmt_fail(ardb *db, sqlite3_stmt *st, int rc, const char *what)
{
    const int code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
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

int ardb__exec(ardb *db, const char *sql, const char *what)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, what);
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

static int open_connection(ardb *db, int create)
{
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
    return ardb__exec(db, "PRAGMA foreign_keys = ON", "PRAGMA foreign_keys = ON");
}

int ardb__open(const char *path, int readonly, int create,
               int (*setup)(ardb *db, int create), ardb **out, char *msg,
               size_t msg_len)
{
    ardb *db;
    int code;

    if (out)
        *out = NULL;
    if (!path || !out || !*path || (readonly && create)) {
        copy_msg(msg, msg_len, "ardb_open: invalid argument");
        return ARDB_EINVAL;
    }
    db = calloc(1, sizeof *db);
    if (!db || !(db->path = strdup(path))) {
        free(db);
        copy_msg(msg, msg_len, "out of memory");
        return ARDB_ENOMEM;
    }
    db->readonly = readonly;
    code = open_connection(db, create);
    if (code == ARDB_DONE)
        code = setup(db, create);
    if (code != ARDB_DONE) {
        copy_msg(msg, msg_len, db->err);
        ardb_close(db);
        return code;
    }
    db->err[0] = '\0';
    *out = db;
    return ARDB_DONE;
}

/* A reader checks the schema and never changes the file: an older version
 * is read as it is (every delta only adds, and the readers that need a
 * later column check the version). */
static int check_schema(ardb *db, int create)
{
    schema_state s;
    int code;
    (void)create;
    if ((code = ardb__schema_read(db, &s)))
        return code;
    return ardb__schema_check(db, &s);
}

int ardb_open_readonly(const char *path, ardb **out, char *msg, size_t msg_len)
{
    return ardb__open(path, 1, 0, check_schema, out, msg, msg_len);
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

/* ---- binaries ---------------------------------------------------------- */

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
        return ardb__stmt_fail(db, st, b.rc, "binary get");
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
