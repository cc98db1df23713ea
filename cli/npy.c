/* npy.c - see npy.h. Format: NumPy's "NEP 1" .npy, versions 1.0-3.0. */
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "atomic_file.h"

static int fail(char *err, size_t len, const char *path, const char *what)
{
    snprintf(err, len, "%s: %s", path, what);
    return -1;
}

/* ---- the header: a Python dict literal ------------------------------- */

/* NumPy reads the header with ast.literal_eval and then requires exactly the
 * keys descr, fortran_order and shape. This parser reads the subset of
 * Python literal syntax such a header can hold, by Python's rules (either
 * quote, True/False, tuples with their comma rules, a repeated key taking the
 * last value), and refuses everything else, so that no header is read
 * differently from NumPy: a header NumPy refuses is refused, one it reads is
 * read or refused with a message, never misread. */
typedef struct hparser {
    const char *text, *p, *end;
    char *err;
    size_t err_len;
    int failed;
} hparser;

static int hfail(hparser *h, const char *what)
{
    if (!h->failed)
        snprintf(h->err, h->err_len, "malformed .npy header: %s (at byte %ld of the header)", what,
                 (long)(h->p - h->text));
    h->failed = 1;
    return -1;
}

/* Whitespace between Python tokens (inside braces newlines are allowed). */
static void hskip(hparser *h)
{
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' || *h->p == '\r' || *h->p == '\f'))
        h->p++;
}

static int hpeek(const hparser *h)
{
    return h->p < h->end ? (unsigned char)*h->p : -1;
}

static int is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* A single- or double-quoted string without escapes or prefixes (a .npy
 * header never needs them); sets *s and *len to its contents. */
static int hstring(hparser *h, const char **s, size_t *len)
{
    int q = hpeek(h);
    if (q != '\'' && q != '"')
        return hfail(h, "expected a quoted string");
    const char *start = ++h->p;
    while (h->p < h->end && *h->p != q) {
        if (*h->p == '\\')
            return hfail(h, "escape sequences in strings are not supported");
        if (*h->p == '\n' || *h->p == '\r')
            return hfail(h, "unterminated string");
        h->p++;
    }
    if (h->p == h->end)
        return hfail(h, "unterminated string");
    *s = start;
    *len = (size_t)(h->p - start);
    h->p++;
    /* Python would join 'a' 'b' or read 'a'b as an error; neither is a key. */
    hskip(h);
    if (hpeek(h) == '\'' || hpeek(h) == '"')
        return hfail(h, "adjacent strings are not supported");
    return 0;
}

/* A name: True, False or anything else Python would not evaluate here. */
static int hname(hparser *h, const char **s, size_t *len)
{
    const char *start = h->p;
    while (h->p < h->end && is_name_char((unsigned char)*h->p))
        h->p++;
    *s = start;
    *len = (size_t)(h->p - start);
    return *len ? 0 : hfail(h, "expected a value");
}

/* A non-negative decimal integer as Python writes one: digits with single
 * underscores between them, no leading zeros but for zero itself. */
static int hdim(hparser *h, int64_t *out)
{
    int c = hpeek(h);
    if (c == '-')
        return hfail(h, "in 'shape': negative dimension");
    if (c < '0' || c > '9')
        return hfail(h, "in 'shape': expected a dimension (a non-negative integer)");
    int64_t v = 0;
    int leading_zero = c == '0', nonzero = 0;
    for (;;) {
        c = hpeek(h);
        if (c >= '0' && c <= '9') {
            if (c != '0')
                nonzero = 1;
            if (v > (INT64_MAX - (c - '0')) / 10)
                return hfail(h, "in 'shape': dimension too large");
            v = v * 10 + (c - '0');
            h->p++;
        } else if (c == '_' && h->p + 1 < h->end && h->p[1] >= '0' && h->p[1] <= '9' && h->p[-1] != '_') {
            h->p++;
        } else {
            break;
        }
    }
    if (leading_zero && nonzero)
        return hfail(h, "in 'shape': leading zeros in a decimal integer are not allowed");
    if (is_name_char(hpeek(h)) || hpeek(h) == '.')
        return hfail(h, "in 'shape': a dimension must be a plain integer");
    *out = v;
    return 0;
}

/* 'shape': a tuple of dimensions. "(16)" is the integer 16, not a tuple. */
static int hshape(hparser *h, npy_array *a)
{
    if (hpeek(h) != '(')
        return hfail(h, "'shape' must be a tuple of non-negative integers such as (3, 4) or (16,)");
    h->p++;
    hskip(h);
    a->ndim = 0;
    if (hpeek(h) == ')') {
        h->p++;
        return 0;
    }
    int commas = 0;
    for (;;) {
        int64_t v;
        if (a->ndim == NPY_MAX_DIMS)
            return hfail(h, "in 'shape': more than 8 dimensions");
        if (hdim(h, &v))
            return -1;
        a->shape[a->ndim++] = v;
        hskip(h);
        if (hpeek(h) == ')') {
            if (!commas)
                return hfail(h, "'shape' is an integer in parentheses, not a tuple (write (N,) for one dimension)");
            h->p++;
            return 0;
        }
        if (hpeek(h) != ',')
            return hfail(h, "in 'shape': expected ',' or ')' after a dimension");
        h->p++;
        commas++;
        hskip(h);
        if (hpeek(h) == ')') {
            h->p++;
            return 0;
        }
    }
}

enum { KEY_DESCR, KEY_ORDER, KEY_SHAPE, NKEYS };

/* The header's values as read (the last of a repeated key). */
typedef struct hvalues {
    int have[NKEYS];
    const char *descr;
    size_t descr_len;
    int fortran, structured;
} hvalues;

static int hitem(hparser *h, hvalues *v, npy_array *a)
{
    const char *key;
    size_t klen;
    if (hpeek(h) != '\'' && hpeek(h) != '"')
        return hfail(h, "expected a quoted key");
    if (hstring(h, &key, &klen))
        return -1;
    hskip(h);
    if (hpeek(h) != ':')
        return hfail(h, "expected ':' after a key");
    h->p++;
    hskip(h);
    if (klen == 5 && memcmp(key, "descr", 5) == 0) {
        if (hpeek(h) == '[') {
            /* A structured dtype: refused for what it is, without reading
             * its nested lists and tuples. */
            v->structured = 1;
            return 0;
        }
        if (hpeek(h) != '\'' && hpeek(h) != '"')
            return hfail(h, "'descr' must be a quoted dtype string such as '<f4'");
        if (hstring(h, &v->descr, &v->descr_len))
            return -1;
        v->structured = 0;
        v->have[KEY_DESCR] = 1;
    } else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) {
        const char *name;
        size_t nlen;
        if (!is_name_char(hpeek(h)) || hname(h, &name, &nlen) ||
            !((nlen == 4 && memcmp(name, "True", 4) == 0) || (nlen == 5 && memcmp(name, "False", 5) == 0)))
            return hfail(h, "'fortran_order' must be True or False");
        v->fortran = nlen == 4;
        v->have[KEY_ORDER] = 1;
    } else if (klen == 5 && memcmp(key, "shape", 5) == 0) {
        if (hshape(h, a))
            return -1;
        v->have[KEY_SHAPE] = 1;
    } else {
        char what[128];
        snprintf(what, sizeof what, "unknown key '%.*s' (a .npy header has descr, fortran_order and shape only)",
                 klen > 32 ? 32 : (int)klen, key);
        return hfail(h, what);
    }
    hskip(h);
    return 0;
}

int npy_parse_header(const char *text, size_t len, npy_array *a, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    hparser h = {.text = text, .p = text, .end = text + len, .err = err, .err_len = err_len};
    hvalues v = {0};
    if (memchr(text, 0, len)) {
        h.p = memchr(text, 0, len);
        return hfail(&h, "a NUL byte");
    }
    hskip(&h);
    if (hpeek(&h) != '{')
        return hfail(&h, "expected a dict '{...}'");
    h.p++;
    hskip(&h);
    while (hpeek(&h) != '}') {
        if (hitem(&h, &v, a))
            goto fail;
        if (v.structured)
            break;
        if (hpeek(&h) == ',') {
            h.p++;
            hskip(&h);
        } else if (hpeek(&h) != '}') {
            hfail(&h, "expected ',' or '}' after a value");
            goto fail;
        }
    }
    if (v.structured) {
        snprintf(err, err_len, "a structured dtype is not float32 ('<f4')");
        goto fail;
    }
    h.p++;
    hskip(&h);
    if (h.p != h.end) {
        hfail(&h, "junk after the header dict (only spaces and a newline may follow '}')");
        goto fail;
    }
    static const char *const names[NKEYS] = {"descr", "fortran_order", "shape"};
    for (int k = 0; k < NKEYS; k++)
        if (!v.have[k]) {
            snprintf(err, err_len, "malformed .npy header: no '%s' (it needs descr, fortran_order and shape)",
                     names[k]);
            goto fail;
        }
    if (v.descr_len != 3 || memcmp(v.descr, "<f4", 3) != 0) {
        if (v.descr_len == 3 && memcmp(v.descr, ">f4", 3) == 0)
            snprintf(err, err_len, "big-endian float32 ('>f4'): byte order must be little-endian ('<f4')");
        else
            snprintf(err, err_len, "dtype '%.*s' is not float32 ('<f4')", v.descr_len > 20 ? 20 : (int)v.descr_len,
                     v.descr);
        goto fail;
    }
    if (v.fortran) {
        snprintf(err, err_len, "Fortran-ordered arrays are not supported (use C order)");
        goto fail;
    }
    a->count = 1;
    for (int i = 0; i < a->ndim; i++) {
        if (a->shape[i] > 0 && a->count > INT64_MAX / 4 / a->shape[i]) {
            snprintf(err, err_len, "array too large: the shape's element count overflows");
            goto fail;
        }
        a->count *= a->shape[i];
    }
    return 0;
fail:
    memset(a, 0, sizeof *a);
    return -1;
}

/* ---- the file ---------------------------------------------------------- */

/* Reads count float32 values from f, which holds exactly `avail` bytes more
 * when known (avail >= 0). The size is checked before anything is allocated,
 * so a small file claiming a huge shape costs nothing; from a pipe the
 * buffer grows only as data actually arrives. */
static int read_data(FILE *f, int64_t avail, npy_array *a, char *err, size_t len, const char *path)
{
    const uint64_t need = (uint64_t)a->count * 4;
    char what[200];
    if (avail >= 0 && (uint64_t)avail < need) {
        snprintf(what, sizeof what, "truncated data: %lld bytes present, the shape needs %llu (%lld float32 values)",
                 (long long)avail, (unsigned long long)need, (long long)a->count);
        return fail(err, len, path, what);
    }
    if (avail >= 0 && (uint64_t)avail > need)
        return fail(err, len, path, "trailing bytes after the array data");
    if (need > SIZE_MAX - 4)
        return fail(err, len, path, "array too large");
    size_t have = 0, cap = 0;
    char *buf = NULL;
    while (have < need) {
        size_t want = (size_t)need;
        if (avail < 0) {
            /* Unknown size: at most double what has arrived so far. */
            size_t step = cap ? cap * 2 : (size_t)1 << 20;
            want = step < need ? step : (size_t)need;
        }
        if (want > cap) {
            char *nb = realloc(buf, want);
            if (!nb) {
                free(buf);
                return fail(err, len, path, "out of memory");
            }
            buf = nb;
            cap = want;
        }
        size_t got = fread(buf + have, 1, want - have, f);
        have += got;
        if (got == 0)
            break;
    }
    if (have < need) {
        free(buf);
        snprintf(what, sizeof what, "truncated data: %zu of %lld float32 values present", have / 4,
                 (long long)a->count);
        return fail(err, len, path, what);
    }
    char extra;
    if (fread(&extra, 1, 1, f) != 0) {
        free(buf);
        return fail(err, len, path, "trailing bytes after the array data");
    }
    a->data = buf ? (float *)buf : malloc(4);
    if (!a->data)
        return fail(err, len, path, "out of memory");
    return 0;
}

int npy_read_f32(const char *path, npy_array *a, char *err, size_t len)
{
    memset(a, 0, sizeof *a);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, len, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    unsigned char pre[10];
    char *header = NULL;
    int rc = -1;
    if (fread(pre, 1, 8, f) != 8 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fail(err, len, path, "not a .npy file (bad magic)");
        goto done;
    }
    size_t hlen, prefix;
    if (pre[7] != 0 || (pre[6] != 1 && pre[6] != 2 && pre[6] != 3)) {
        char what[96];
        snprintf(what, sizeof what, "unsupported .npy format version %u.%u (1.0, 2.0 and 3.0 are read)", pre[6],
                 pre[7]);
        fail(err, len, path, what);
        goto done;
    }
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) {
            fail(err, len, path, "truncated .npy header");
            goto done;
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
        prefix = 10;
    } else {
        unsigned char l4[4];
        if (fread(l4, 1, 4, f) != 4) {
            fail(err, len, path, "truncated .npy header");
            goto done;
        }
        hlen = (size_t)l4[0] | (size_t)l4[1] << 8 | (size_t)l4[2] << 16 | (size_t)l4[3] << 24;
        prefix = 12;
    }
    if (hlen > (1u << 20)) {
        fail(err, len, path, "implausibly large .npy header");
        goto done;
    }
    header = malloc(hlen + 1);
    if (!header || fread(header, 1, hlen, f) != hlen) {
        fail(err, len, path, "truncated .npy header");
        goto done;
    }
    header[hlen] = 0;
    char msg[400];
    if (npy_parse_header(header, hlen, a, msg, sizeof msg)) {
        fail(err, len, path, msg);
        goto done;
    }
    struct stat st;
    int64_t avail = -1;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode))
        avail = (int64_t)st.st_size - (int64_t)(prefix + hlen);
    if (read_data(f, avail, a, err, len, path))
        goto done;
    rc = 0;
done:
    free(header);
    fclose(f);
    if (rc != 0)
        npy_free(a);
    return rc;
}

void npy_free(npy_array *a)
{
    free(a->data);
    memset(a, 0, sizeof *a);
}

int npy_write_f32_stream(FILE *f, const float *data, int ndim, const int64_t *shape)
{
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%lld,%s", (long long)shape[i],
                      i + 1 < ndim ? " " : "");
        count *= shape[i];
    }
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
    /* Pad so the data starts on a 64-byte boundary, ending with '\n'. */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int bad = fwrite(pre, 1, 10, f) != 10 || fwrite(dict, 1, (size_t)n, f) != (size_t)n;
    for (size_t i = 0; i < pad && !bad; i++)
        bad = fputc(' ', f) == EOF;
    bad = bad || fputc('\n', f) == EOF;
    bad = bad || fwrite(data, 4, (size_t)count, f) != (size_t)count;
    return bad ? -1 : 0;
}

int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err, size_t len)
{
    atomic_file out;
    if (atomic_file_open(&out, path, err, len))
        return -1;
    errno = 0;
    if (npy_write_f32_stream(out.f, data, ndim, shape) != 0) {
        snprintf(err, len, "cannot write %s: %s", path, errno ? strerror(errno) : "write error");
        atomic_file_discard(&out);
        return -1;
    }
    const int rc = atomic_file_close(&out, err, len) || atomic_file_commit(&out, err, len) ? -1 : 0;
    atomic_file_discard(&out);
    return rc;
}
