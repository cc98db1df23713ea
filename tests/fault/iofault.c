/*
 * iofault.c - an LD_PRELOAD library that makes chosen file operations fail,
 * as SQLite's test VFS does, for the I/O-error tests (test_io_errors.py).
 *
 * It wraps the calls that open, write, sync, truncate, rename and close
 * files, and fails the Nth call (or every call from the Nth on) that
 * touches a path containing IOFAULT_PATH. Descriptors are followed from
 * the open that named a matching path to their close, so a write or a
 * sync on such a descriptor counts. Settings, read once:
 *
 *   IOFAULT_PATH     the substring a path must contain (unset: nothing fails)
 *   IOFAULT_OP       comma-separated kinds of call that count: open (opens
 *                    that may create or write), write, sync, truncate,
 *                    rename, close; default write
 *   IOFAULT_ERRNO    EIO, ENOSPC, EFBIG, EDQUOT or a number; default EIO
 *   IOFAULT_NTH      the counted call that fails, from 1; default 1
 *   IOFAULT_PERSIST  1: every counted call from the Nth on fails
 *   IOFAULT_LOG      a file that gets one line per failed call ("fired ..."),
 *                    and at a normal exit the number of calls counted
 *                    ("counted K"), so that a test knows whether the fault
 *                    was reached and how many calls there are to fail
 *
 * Only the process that loaded it first counts: children it forks or execs
 * (the tuner's measuring processes, the C compiler) fail nothing, so that
 * a run of a command fails at one place only.
 *
 * Writes through stdio reach the kernel inside glibc, which no preloaded
 * library can wrap; they count where the buffer is handed over (fflush,
 * fclose with data pending), and failing there drops the pending data, as
 * a failed write would. The full-disk tests cover stdio's own writes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_OPEN = 1, OP_WRITE = 2, OP_SYNC = 4, OP_TRUNCATE = 8, OP_RENAME = 16, OP_CLOSE = 32 };

#define MAX_FD 65536

static const char *pattern;
static unsigned ops = OP_WRITE;
static int fail_errno = EIO;
static long nth = 1;
static int persist;
static const char *log_path;
static int armed;
static long counted;
static unsigned char tracked[MAX_FD];

static ssize_t (*real_write)(int, const void *, size_t);

static void *real(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f)
        abort(); /* a test library that cannot reach libc cannot test anything */
    return f;
}

/* fn, the real function `name` (the next one after this library's),
 * looked up on its first call. */
#define REAL_FN(name)                  \
    static __typeof__(&name) fn;       \
    if (!fn)                           \
        fn = (__typeof__(&name))real(#name)

/* The body of a wrapper that fails with -1 (errno set by fires) where
 * `fault` holds and the operation op fires, and otherwise makes the real
 * call with the arguments. */
#define FAIL_OR_CALL(name, op, fault, ...)   \
    do {                                     \
        REAL_FN(name);                       \
        if ((fault) && fires(op, #name))     \
            return -1;                       \
        return fn(__VA_ARGS__);              \
    } while (0)

__attribute__((constructor)) static void iofault_init(void)
{
    real_write = real("write");
    pattern = getenv("IOFAULT_PATH");
    if (!pattern || !*pattern)
        return;
    /* The first process to load the library owns the fault; what it
     * starts inherits the variable and counts nothing. */
    char me[32];
    snprintf(me, sizeof me, "%ld", (long)getpid());
    const char *owner = getenv("IOFAULT_OWNER");
    if (owner && strcmp(owner, me) != 0)
        return;
    setenv("IOFAULT_OWNER", me, 1);
    const char *op = getenv("IOFAULT_OP");
    static const struct {
        const char *name;
        int op;
    } op_names[] = {{"open", OP_OPEN},         {"write", OP_WRITE},   {"sync", OP_SYNC},
                    {"truncate", OP_TRUNCATE}, {"rename", OP_RENAME}, {"close", OP_CLOSE}};
    if (op && *op) {
        ops = 0;
        for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++)
            if (strstr(op, op_names[i].name))
                ops |= op_names[i].op;
    }
    static const struct {
        const char *name;
        int value;
    } errno_names[] = {{"EIO", EIO}, {"ENOSPC", ENOSPC}, {"EFBIG", EFBIG}, {"EDQUOT", EDQUOT}};
    const char *e = getenv("IOFAULT_ERRNO");
    if (e && *e) {
        fail_errno = atoi(e);
        for (size_t i = 0; i < sizeof errno_names / sizeof errno_names[0]; i++)
            if (strcmp(e, errno_names[i].name) == 0)
                fail_errno = errno_names[i].value;
    }
    const char *n = getenv("IOFAULT_NTH");
    if (n && atol(n) > 0)
        nth = atol(n);
    const char *p = getenv("IOFAULT_PERSIST");
    persist = p && strcmp(p, "1") == 0;
    log_path = getenv("IOFAULT_LOG");
    armed = 1;
}

static int mine(void) { return armed && getenv("IOFAULT_OWNER") && atol(getenv("IOFAULT_OWNER")) == (long)getpid(); }

/* A relative path is matched as the absolute one it names. */
static int path_matches(const char *path)
{
    if (!path || !mine())
        return 0;
    if (path[0] == '/')
        return strstr(path, pattern) != NULL;
    char full[8192];
    if (!getcwd(full, sizeof full - 1))
        return 0;
    size_t used = strlen(full);
    snprintf(full + used, sizeof full - used, "/%s", path);
    return strstr(full, pattern) != NULL;
}

static int fd_matches(int fd) { return fd >= 0 && fd < MAX_FD && tracked[fd] && mine(); }

static void track(int fd, const char *path)
{
    if (fd >= 0 && fd < MAX_FD)
        tracked[fd] = path_matches(path);
}

/* Whether this counted call fails; logs it when it does. */
static int fires(unsigned op, const char *what)
{
    if (!(ops & op))
        return 0;
    const long k = __atomic_add_fetch(&counted, 1, __ATOMIC_RELAXED);
    if (k != nth && !(persist && k > nth))
        return 0;
    if (log_path) {
        int (*open_fn)(const char *, int, ...) = real("open");
        int fd = open_fn(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            char line[256];
            int len = snprintf(line, sizeof line, "fired %s call %ld errno %d\n", what, k, fail_errno);
            if (len > 0)
                (void)real_write(fd, line, (size_t)len);
            close(fd);
        }
    }
    errno = fail_errno;
    return 1;
}

static int may_write(int flags) { return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)) != 0; }

/* At exit, the count of calls that counted ("counted K"), so that a sweep
 * knows how far to go. */
__attribute__((destructor)) static void iofault_fini(void)
{
    if (!log_path || !mine())
        return;
    int (*open_fn)(const char *, int, ...) = real("open");
    int fd = open_fn(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        char line[64];
        int len = snprintf(line, sizeof line, "counted %ld\n", counted);
        if (len > 0)
            (void)real_write(fd, line, (size_t)len);
        close(fd);
    }
}

/* ---- opening ------------------------------------------------------------ */

#define OPEN_WRAPPER(name, ...)                                                                                   \
    {                                                                                                             \
        mode_t mode = 0;                                                                                          \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                                      \
            va_list ap;                                                                                           \
            va_start(ap, flags);                                                                                  \
            mode = va_arg(ap, mode_t);                                                                            \
            va_end(ap);                                                                                           \
        }                                                                                                         \
        if (path_matches(path) && may_write(flags) && fires(OP_OPEN, #name))                                      \
            return -1;                                                                                            \
        int fd = fn(__VA_ARGS__);                                                                                 \
        track(fd, path);                                                                                          \
        return fd;                                                                                                \
    }

int open(const char *path, int flags, ...)
{
    REAL_FN(open);
    OPEN_WRAPPER(open, path, flags, mode)
}

int open64(const char *path, int flags, ...)
{
    REAL_FN(open64);
    OPEN_WRAPPER(open64, path, flags, mode)
}

int openat(int dirfd, const char *path, int flags, ...)
{
    REAL_FN(openat);
    OPEN_WRAPPER(openat, dirfd, path, flags, mode)
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    REAL_FN(openat64);
    OPEN_WRAPPER(openat64, dirfd, path, flags, mode)
}

int creat(const char *path, mode_t mode) { return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) { return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode); }

/* mkstemp opens inside glibc: the template names the path. */
#define MKSTEMP_WRAPPER(name, ...)                                                                                \
    {                                                                                                             \
        if (path_matches(tmpl) && fires(OP_OPEN, #name))                                                          \
            return -1;                                                                                            \
        int fd = fn(__VA_ARGS__);                                                                                 \
        track(fd, tmpl);                                                                                          \
        return fd;                                                                                                \
    }

int mkstemp(char *tmpl)
{
    REAL_FN(mkstemp);
    MKSTEMP_WRAPPER(mkstemp, tmpl)
}

int mkstemp64(char *tmpl)
{
    REAL_FN(mkstemp64);
    MKSTEMP_WRAPPER(mkstemp64, tmpl)
}

int mkostemp(char *tmpl, int flags)
{
    REAL_FN(mkostemp);
    MKSTEMP_WRAPPER(mkostemp, tmpl, flags)
}

static int mode_writes(const char *mode) { return strpbrk(mode, "wa+") != NULL; }

/* fopen and fopen64 through the real one, fn, named name. */
static FILE *open_stream(FILE *(*fn)(const char *, const char *), const char *name, const char *path, const char *mode)
{
    if (path_matches(path) && mode_writes(mode) && fires(OP_OPEN, name))
        return NULL;
    FILE *f = fn(path, mode);
    if (f)
        track(fileno(f), path);
    return f;
}

FILE *fopen(const char *path, const char *mode)
{
    REAL_FN(fopen);
    return open_stream(fn, "fopen", path, mode);
}

FILE *fopen64(const char *path, const char *mode)
{
    REAL_FN(fopen64);
    return open_stream(fn, "fopen64", path, mode);
}

/* ---- writing ------------------------------------------------------------ */

ssize_t write(int fd, const void *buf, size_t n)
{
    if (fd_matches(fd) && fires(OP_WRITE, "write"))
        return -1;
    return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    FAIL_OR_CALL(pwrite, OP_WRITE, fd_matches(fd), fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    FAIL_OR_CALL(pwrite64, OP_WRITE, fd_matches(fd), fd, buf, n, off);
}

ssize_t writev(int fd, const struct iovec *iov, int count)
{
    FAIL_OR_CALL(writev, OP_WRITE, fd_matches(fd), fd, iov, count);
}

/* Drops what stdio holds for f, as a write that failed would lose it, and
 * marks the stream as failed (glibc's error flag, which ferror reads). */
static void drop_pending(FILE *f)
{
    f->_IO_write_ptr = f->_IO_write_base;
    f->_flags |= _IO_ERR_SEEN;
}

static int pending(FILE *f) { return f && f->_IO_write_ptr > f->_IO_write_base; }

int fflush(FILE *f)
{
    REAL_FN(fflush);
    if (pending(f) && fd_matches(fileno(f)) && fires(OP_WRITE, "fflush")) {
        const int e = errno;
        drop_pending(f);
        errno = e;
        return EOF;
    }
    return fn(f);
}

int fclose(FILE *f)
{
    REAL_FN(fclose);
    const int fd = f ? fileno(f) : -1;
    int failed = 0, e = 0;
    if (pending(f) && fd_matches(fd) && fires(OP_WRITE, "fclose")) {
        e = errno;
        drop_pending(f);
        failed = 1;
    }
    if (!failed && fd_matches(fd) && fires(OP_CLOSE, "fclose")) {
        e = errno;
        failed = 1;
    }
    if (fd >= 0 && fd < MAX_FD)
        tracked[fd] = 0;
    const int rc = fn(f);
    if (failed) {
        errno = e;
        return EOF;
    }
    return rc;
}

/* ---- syncing, truncating, renaming, closing ----------------------------- */

int fsync(int fd)
{
    FAIL_OR_CALL(fsync, OP_SYNC, fd_matches(fd), fd);
}

int fdatasync(int fd)
{
    FAIL_OR_CALL(fdatasync, OP_SYNC, fd_matches(fd), fd);
}

int ftruncate(int fd, off_t len)
{
    FAIL_OR_CALL(ftruncate, OP_TRUNCATE, fd_matches(fd), fd, len);
}

int ftruncate64(int fd, off64_t len)
{
    FAIL_OR_CALL(ftruncate64, OP_TRUNCATE, fd_matches(fd), fd, len);
}

int rename(const char *from, const char *to)
{
    FAIL_OR_CALL(rename, OP_RENAME, path_matches(from) || path_matches(to), from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to)
{
    FAIL_OR_CALL(renameat, OP_RENAME, path_matches(from) || path_matches(to), fromfd, from, tofd, to);
}

/* A close that fails has still closed the descriptor, as on Linux. */
int close(int fd)
{
    REAL_FN(close);
    const int failing = fd_matches(fd) && fires(OP_CLOSE, "close");
    const int e = errno;
    if (fd >= 0 && fd < MAX_FD)
        tracked[fd] = 0;
    const int rc = fn(fd);
    if (failing) {
        errno = e;
        return -1;
    }
    return rc;
}
