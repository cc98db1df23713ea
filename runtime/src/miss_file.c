/*
 * miss_file.c - recording the problems plans fall back on, and reading the
 * record back (see miss_file.h for the format).
 *
 * The writer never fails a plan or a run: whatever goes wrong (no path, a
 * file that cannot be opened, a full disk, a file past AR_MISS_FILE_MAX)
 * drops the line. It allocates nothing, so the hot path stays free of
 * malloc. Lines already in the file (read once per process and path) and
 * lines this process wrote are not written again; two processes meeting
 * the same miss at the same moment may both write it, and readers keep
 * one.
 *
 * The hot path must never wait on the file: it is opened non-blocking and
 * used only if it is a regular file (a FIFO nobody reads would block an
 * open or a write forever), and no system call on it runs under the lock.
 */
#define _GNU_SOURCE
#include "miss_file.h"
#include "device.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MISS_MAGIC "attnres-miss 1 sum="
#define MISS_CUT "attnres-miss cut" /* follows a line that was cut short */
#define MISS_PATH_MAX 4096
#define MISS_SEEN_MAX 8192 /* distinct lines one process remembers (a full file holds fewer) */

static uint32_t fnv1a32(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static uint64_t fnv1a64(const char *s, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h ? h : 1; /* 0 marks an empty slot */
}

/* ---- where to write --------------------------------------------------- */

static pthread_mutex_t miss_lock = PTHREAD_MUTEX_INITIALIZER;
static int api_chosen;               /* attnres_miss_file_set was called */
static char api_path[MISS_PATH_MAX]; /* "" = off */
static int env_read;
static char env_path[MISS_PATH_MAX];
static int enabled = -1; /* -1 not yet known, 0 off, 1 on; atomic */

/* The lines of the file at seen_path, by content hash (open addressing). */
static char seen_path[MISS_PATH_MAX];
static uint64_t seen[MISS_SEEN_MAX];
static size_t seen_count;
/* The last path found not to be a regular file: nothing is written to it
 * until attnres_miss_file_set is called again. */
static char refused_path[MISS_PATH_MAX];

/* Under miss_lock: the path in force, or NULL. */
static const char *current_path(void)
{
    if (api_chosen)
        return api_path[0] ? api_path : NULL;
    if (!env_read) {
        const char *e = getenv("ATTNRES_MISS_FILE");
        if (e && *e && strlen(e) < sizeof env_path)
            snprintf(env_path, sizeof env_path, "%s", e);
        env_read = 1;
    }
    return env_path[0] ? env_path : NULL;
}

int attnres_miss_file_set(const char *path)
{
    if (path && strlen(path) >= MISS_PATH_MAX)
        return ATTNRES_EINVAL;
    pthread_mutex_lock(&miss_lock);
    api_chosen = 1;
    snprintf(api_path, sizeof api_path, "%s", path ? path : "");
    refused_path[0] = 0;
    __atomic_store_n(&enabled, api_path[0] ? 1 : 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&miss_lock);
    return ATTNRES_OK;
}

int ar_miss_file_path(char *buf, size_t len)
{
    pthread_mutex_lock(&miss_lock);
    const char *p = current_path();
    if (p)
        snprintf(buf, len, "%s", p);
    pthread_mutex_unlock(&miss_lock);
    return p ? 0 : -1;
}

static int recording(void)
{
    int e = __atomic_load_n(&enabled, __ATOMIC_ACQUIRE);
    if (e < 0) {
        pthread_mutex_lock(&miss_lock);
        e = current_path() ? 1 : 0;
        __atomic_store_n(&enabled, e, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&miss_lock);
    }
    return e;
}

/* ---- deduplication ---------------------------------------------------- */

/* Under miss_lock. 1 if h was there, 0 if added, -1 if the table is full. */
static int seen_insert(uint64_t h)
{
    if (seen_count >= MISS_SEEN_MAX / 2)
        return -1;
    size_t i = (size_t)(h % MISS_SEEN_MAX);
    while (seen[i]) {
        if (seen[i] == h)
            return 1;
        i = (i + 1) % MISS_SEEN_MAX;
    }
    seen[i] = h;
    seen_count++;
    return 0;
}

/* The content of a line: the text after "attnres-miss 1 sum=XXXXXXXX ". */
static int line_content(const char *line, size_t len, const char **content, size_t *clen)
{
    const size_t head = sizeof MISS_MAGIC - 1 + 9;
    if (len <= head || memcmp(line, MISS_MAGIC, sizeof MISS_MAGIC - 1) != 0 || line[head - 1] != ' ')
        return -1;
    *content = line + head;
    *clen = len - head;
    return 0;
}

/* Opens the miss file without ever blocking: O_NONBLOCK, so that a FIFO's
 * open returns at once, then anything but a regular file is closed and
 * refused. The descriptor; -1 when the open fails, -2 when the path is not
 * a regular file. */
static int open_miss_file(const char *path, int flags)
{
    int fd = open(path, flags | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
    if (fd < 0)
        return -1;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return -2;
    }
    return fd;
}

/* Remembers the lines already in the file open at fd, which is the file at
 * path. It reads without the lock and takes it for each line, so that no
 * other thread waits on the disk; a line another thread writes meanwhile
 * may be written twice, which readers tolerate. */
static void load_seen(int fd, const char *path)
{
    pthread_mutex_lock(&miss_lock);
    const int loaded = strcmp(seen_path, path) == 0;
    if (!loaded) {
        memset(seen, 0, sizeof seen);
        seen_count = 0;
        snprintf(seen_path, sizeof seen_path, "%s", path);
    }
    pthread_mutex_unlock(&miss_lock);
    if (loaded)
        return;
    char buf[4096], line[AR_MISS_LINE_MAX];
    size_t used = 0;
    int64_t total = 0;
    int skipping = 0; /* inside a line too long to be ours */
    ssize_t got;
    while (total < AR_MISS_FILE_MAX && (got = pread(fd, buf, sizeof buf, (off_t)total)) > 0) {
        total += got;
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] != '\n') {
                if (used < sizeof line)
                    line[used++] = buf[i];
                else
                    skipping = 1;
                continue;
            }
            const char *c;
            size_t clen;
            if (!skipping && line_content(line, used, &c, &clen) == 0) {
                const uint64_t h = fnv1a64(c, clen);
                pthread_mutex_lock(&miss_lock);
                if (strcmp(seen_path, path) == 0)
                    (void)seen_insert(h);
                pthread_mutex_unlock(&miss_lock);
            }
            used = 0;
            skipping = 0;
        }
    }
}

/* ---- writing ---------------------------------------------------------- */

static const char *op_text(attnres_op op) { return ar_op_name(op); }

void ar_miss_site_arm(ar_miss_site *site, const attnres_problem *p, const char *fingerprint)
{
    memset(site, 0, sizeof *site);
    int n = snprintf(site->key, sizeof site->key,
                     "op=%s dtype=%s d=%" PRId64 " n=%d heads=%d s=%d form=%s epilogue=%d fuse=%d", op_text(p->op),
                     attnres_dtype_name(p->dtype), p->d, p->n, p->heads, p->s,
                     p->form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace", p->epilogue, p->fuse_add);
    int m = snprintf(site->device, sizeof site->device, "%s", fingerprint);
    /* A fingerprint the reader would refuse is not recorded. */
    int printable = m > 0 && (size_t)m < sizeof(((ar_miss *)0)->device);
    for (const char *c = site->device; printable && *c; c++)
        printable = *c >= 0x20 && *c < 0x7f;
    site->armed = n > 0 && (size_t)n < sizeof site->key && printable;
}

static void append_line(const ar_miss_site *site, int64_t t)
{
    char content[AR_MISS_LINE_MAX], line[AR_MISS_LINE_MAX + 2], path[MISS_PATH_MAX];
    int clen = snprintf(content, sizeof content, "%s t=%" PRId64 " device=%s", site->key, t, site->device);
    if (clen < 0 || (size_t)clen >= sizeof content)
        return;
    int len = snprintf(line, sizeof line, "%s%08" PRIx32 " %s\n", MISS_MAGIC, fnv1a32(content, (size_t)clen),
                       content);
    if (len < 0 || len > AR_MISS_LINE_MAX)
        return;
    pthread_mutex_lock(&miss_lock);
    const char *cur = current_path();
    const int usable = cur && strcmp(cur, refused_path) != 0;
    if (usable)
        snprintf(path, sizeof path, "%s", cur);
    pthread_mutex_unlock(&miss_lock);
    if (!usable)
        return;
    int fd = open_miss_file(path, O_RDWR | O_APPEND | O_CREAT);
    if (fd == -2) {
        pthread_mutex_lock(&miss_lock);
        snprintf(refused_path, sizeof refused_path, "%s", path);
        pthread_mutex_unlock(&miss_lock);
    }
    if (fd < 0)
        return;
    load_seen(fd, path);
    pthread_mutex_lock(&miss_lock);
    const int fresh = seen_insert(fnv1a64(content, (size_t)clen)) == 0;
    pthread_mutex_unlock(&miss_lock);
    struct stat sb;
    if (fresh && fstat(fd, &sb) == 0 && sb.st_size + len + (int)sizeof MISS_CUT <= AR_MISS_FILE_MAX) {
        /* A last line cut short (a writer died, a disk filled) is closed
         * and marked, so that this line stays whole and readers skip it. */
        char last = '\n';
        const char *text = line;
        size_t tlen = (size_t)len;
        char marked[sizeof MISS_CUT + 1 + sizeof line];
        if (sb.st_size > 0 && pread(fd, &last, 1, sb.st_size - 1) == 1 && last != '\n') {
            int m = snprintf(marked, sizeof marked, "\n" MISS_CUT "\n%s", line);
            if (m > 0 && (size_t)m < sizeof marked) {
                text = marked;
                tlen = (size_t)m;
            }
        }
        /* One write: O_APPEND puts it at the end whatever others append. */
        ssize_t w;
        do
            w = write(fd, text, tlen);
        while (w < 0 && errno == EINTR);
    }
    close(fd);
}

int ar_miss_file_usable(const char *path, char *why, size_t why_len)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode))
        return 1; /* a file not there yet is created by the first line */
    snprintf(why, why_len, "%s is not a regular file (%s): nothing is recorded in it", path,
             S_ISFIFO(sb.st_mode)  ? "a FIFO"
             : S_ISDIR(sb.st_mode) ? "a directory"
             : S_ISCHR(sb.st_mode) ? "a character device"
                                   : "not a plain file");
    return 0;
}

void ar_miss_site_note(ar_miss_site *site, int64_t T)
{
    if (!site->armed || T < 1)
        return;
    int64_t t = 1;
    int b = 0;
    while (t < T && t < AR_MISS_MAX_T) {
        t <<= 1;
        b++;
    }
    const uint64_t bit = (uint64_t)1 << b;
    if (__atomic_load_n(&site->seen, __ATOMIC_RELAXED) & bit)
        return;
    if (!recording())
        return;
    if (__atomic_fetch_or(&site->seen, bit, __ATOMIC_RELAXED) & bit)
        return; /* another thread got there first */
    append_line(site, t);
}

/* ---- reading ---------------------------------------------------------- */

/* Reads "NAME=" at *s and the value up to the next space (or the end);
 * 0 with the value in [*v, *v + *vlen). */
static int field(const char **s, const char *end, const char *name, const char **v, size_t *vlen)
{
    size_t nlen = strlen(name);
    if ((size_t)(end - *s) < nlen + 1 || memcmp(*s, name, nlen) != 0 || (*s)[nlen] != '=')
        return -1;
    *v = *s + nlen + 1;
    const char *sp = memchr(*v, ' ', (size_t)(end - *v));
    const char *stop = sp ? sp : end;
    *vlen = (size_t)(stop - *v);
    *s = sp ? sp + 1 : end;
    return 0;
}

/* A decimal integer in [lo, hi], digits only (no sign, no leading zeros). */
static int int_in(const char *v, size_t n, int64_t lo, int64_t hi, int64_t *out)
{
    if (n == 0 || n > 19 || (n > 1 && v[0] == '0'))
        return -1;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (v[i] - '0');
        if (x > hi)
            return -1;
    }
    if (x < lo)
        return -1;
    *out = x;
    return 0;
}

static int word_is(const char *v, size_t n, const char *w) { return strlen(w) == n && memcmp(v, w, n) == 0; }

int ar_miss_parse_line(const char *line, size_t len, ar_miss *out, char *err, size_t err_len)
{
    const char *end = line + len, *c;
    size_t clen;
    if (len >= AR_MISS_LINE_MAX) {
        snprintf(err, err_len, "line is %zu bytes, more than a miss line has", len);
        return -1;
    }
    if (line_content(line, len, &c, &clen) != 0) {
        snprintf(err, err_len, "not a miss line (expected \"%sXXXXXXXX op=...\")", MISS_MAGIC);
        return -1;
    }
    uint32_t want = 0;
    for (int i = 0; i < 8; i++) {
        char h = line[sizeof MISS_MAGIC - 1 + (size_t)i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : -1;
        if (d < 0) {
            snprintf(err, err_len, "sum is not 8 lowercase hex digits");
            return -1;
        }
        want = want << 4 | (uint32_t)d;
    }
    if (fnv1a32(c, clen) != want) {
        snprintf(err, err_len, "sum %08" PRIx32 " does not match the line (damaged)", want);
        return -1;
    }
    static const struct { const char *name; int64_t lo, hi; } ints[] = {
        {"d", 1, ATTNRES_MAX_D}, {"n", 1, ATTNRES_MAX_N}, {"heads", 1, ATTNRES_MAX_HEADS}, {"s", 0, ATTNRES_MAX_S},
    };
    const char *s = c, *v;
    size_t n;
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 1, 1);
    if (field(&s, end, "op", &v, &n) != 0)
        goto bad_field_op;
    int op = 0;
    while (op < AR_OPS && !word_is(v, n, ar_op_name((attnres_op)op)))
        op++;
    if (op == AR_OPS) {
        snprintf(err, err_len, "op must be mix, phase1, phase2, mix_backward, phase1_backward or phase2_backward");
        return -1;
    }
    p.op = (attnres_op)op;
    if (field(&s, end, "dtype", &v, &n) != 0) {
        snprintf(err, err_len, "expected dtype= after op");
        return -1;
    }
    char dt[8];
    if (n >= sizeof dt || (memcpy(dt, v, n), dt[n] = 0, attnres_dtype_parse(dt, &p.dtype) != ATTNRES_OK)) {
        snprintf(err, err_len, "dtype must be f32, bf16 or f16");
        return -1;
    }
    int64_t x[4];
    for (int i = 0; i < 4; i++) {
        if (field(&s, end, ints[i].name, &v, &n) != 0) {
            snprintf(err, err_len, "expected %s= (fields: op dtype d n heads s form epilogue fuse t device)",
                     ints[i].name);
            return -1;
        }
        if (int_in(v, n, ints[i].lo, ints[i].hi, &x[i]) != 0) {
            snprintf(err, err_len, "%s must be an integer in [%" PRId64 ", %" PRId64 "] (got '%.*s')", ints[i].name,
                     ints[i].lo, ints[i].hi, (int)(n > 32 ? 32 : n), v);
            return -1;
        }
    }
    p.d = x[0];
    p.n = (int32_t)x[1];
    p.heads = (int32_t)x[2];
    p.s = (int32_t)x[3];
    if (field(&s, end, "form", &v, &n) != 0 || !(word_is(v, n, "replace") || word_is(v, n, "additive"))) {
        snprintf(err, err_len, "expected form=replace or form=additive after s");
        return -1;
    }
    p.form = word_is(v, n, "additive") ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    int64_t flag;
    if (field(&s, end, "epilogue", &v, &n) != 0 || int_in(v, n, 0, 1, &flag) != 0) {
        snprintf(err, err_len, "expected epilogue=0 or epilogue=1 after form");
        return -1;
    }
    p.epilogue = (int32_t)flag;
    if (field(&s, end, "fuse", &v, &n) != 0 || int_in(v, n, 0, 1, &flag) != 0) {
        snprintf(err, err_len, "expected fuse=0 or fuse=1 after epilogue");
        return -1;
    }
    p.fuse_add = (int32_t)flag;
    int64_t t;
    if (field(&s, end, "t", &v, &n) != 0 || int_in(v, n, 1, AR_MISS_MAX_T, &t) != 0 || (t & (t - 1)) != 0) {
        snprintf(err, err_len, "expected t= a power of two in [1, %" PRId64 "] after fuse", AR_MISS_MAX_T);
        return -1;
    }
    if ((size_t)(end - s) < 8 || memcmp(s, "device=", 7) != 0) {
        snprintf(err, err_len, "expected device=FINGERPRINT after t");
        return -1;
    }
    s += 7;
    n = (size_t)(end - s);
    if (n >= sizeof out->device) {
        snprintf(err, err_len, "device fingerprint longer than %zu bytes", sizeof out->device - 1);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] >= 0x7f) {
            snprintf(err, err_len, "device fingerprint has a byte outside printable ASCII");
            return -1;
        }
    char why[256];
    if (attnres_problem_check(&p, why, sizeof why) != ATTNRES_OK) {
        snprintf(err, err_len, "not a valid problem: %s", why);
        return -1;
    }
    out->p = p;
    out->t = t;
    memcpy(out->device, s, n);
    out->device[n] = 0;
    return 0;
bad_field_op:
    snprintf(err, err_len, "expected op= after the sum");
    return -1;
}

int ar_miss_format_line(const ar_miss *m, char *buf, size_t len)
{
    ar_miss_site site;
    ar_miss_site_arm(&site, &m->p, m->device);
    char content[AR_MISS_LINE_MAX];
    int clen = snprintf(content, sizeof content, "%s t=%" PRId64 " device=%s", site.key, m->t, site.device);
    if (!site.armed || clen < 0 || (size_t)clen >= sizeof content)
        return -1;
    int n = snprintf(buf, len, "%s%08" PRIx32 " %s\n", MISS_MAGIC, fnv1a32(content, (size_t)clen), content);
    if (n < 0 || (size_t)n >= len || n > AR_MISS_LINE_MAX)
        return -1;
    ar_miss back;
    char err[16];
    if (ar_miss_parse_line(buf, (size_t)n - 1, &back, err, sizeof err) != 0)
        return -1;
    return n;
}

static int same_miss(const ar_miss *a, const ar_miss *b)
{
    return a->p.op == b->p.op && a->p.dtype == b->p.dtype && a->p.d == b->p.d && a->p.n == b->p.n &&
           a->p.heads == b->p.heads && a->p.s == b->p.s && a->p.form == b->p.form &&
           a->p.epilogue == b->p.epilogue && a->p.fuse_add == b->p.fuse_add && a->t == b->t &&
           strcmp(a->device, b->device) == 0;
}

int ar_miss_read_file(const char *path, ar_miss **out, size_t *count, int *torn, char *err, size_t err_len)
{
    *out = NULL;
    *count = 0;
    *torn = 0;
    /* Non-blocking: a FIFO's open would wait for a writer. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    if (sb.st_size > AR_MISS_READ_MAX) {
        snprintf(err, err_len, "%s: %lld bytes, more than the %lld a miss file may hold", path,
                 (long long)sb.st_size, (long long)AR_MISS_READ_MAX);
        close(fd);
        return -1;
    }
    size_t size = (size_t)sb.st_size, got = 0;
    char *text = malloc(size + 1);
    if (!text) {
        snprintf(err, err_len, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    while (got < size) {
        ssize_t r = read(fd, text + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    size = got; /* a file that shrank while being read: what was there */
    ar_miss *items = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    int rc = 0;
    for (size_t pos = 0; pos < size;) {
        lineno++;
        const char *nl = memchr(text + pos, '\n', size - pos);
        if (!nl) {
            (*torn)++; /* a write cut short: never a whole line */
            break;
        }
        size_t len = (size_t)(nl - (text + pos));
        const char *at = text + pos;
        pos += len + 1;
        const size_t cut_len = sizeof MISS_CUT - 1;
        if (len == cut_len && memcmp(at, MISS_CUT, cut_len) == 0)
            continue; /* the writer's mark: the line before it was cut short */
        ar_miss m;
        char why[256];
        if (ar_miss_parse_line(at, len, &m, why, sizeof why) != 0) {
            const char *next = text + pos;
            if (size - pos >= cut_len + 1 && memcmp(next, MISS_CUT "\n", cut_len + 1) == 0) {
                (*torn)++; /* cut short, and marked so by the next writer */
                continue;
            }
            snprintf(err, err_len, "%s:%zu: %s", path, lineno, why);
            rc = -1;
            break;
        }
        int dup = 0;
        for (size_t i = 0; i < n && !dup; i++)
            dup = same_miss(&items[i], &m);
        if (dup)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            ar_miss *grown = realloc(items, cap * sizeof *grown);
            if (!grown) {
                snprintf(err, err_len, "%s: out of memory", path);
                rc = -1;
                break;
            }
            items = grown;
        }
        items[n++] = m;
    }
    free(text);
    if (rc != 0) {
        free(items);
        *torn = 0;
        return -1;
    }
    *out = items;
    *count = n;
    return 0;
}
