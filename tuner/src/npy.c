/* npy.c - see npy.h. Format: NumPy's "NEP 1" .npy, versions 1.0-3.0. */
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(char *err, size_t len, const char *path, const char *what)
{
    snprintf(err, len, "%s: %s", path, what);
    return -1;
}

/* Finds the value text after 'key': in the header dict. */
static const char *dict_value(const char *header, const char *key)
{
    char pattern[64];
    snprintf(pattern, sizeof pattern, "'%s'", key);
    const char *p = strstr(header, pattern);
    if (!p)
        return NULL;
    p += strlen(pattern);
    while (*p == ' ')
        p++;
    if (*p != ':')
        return NULL;
    p++;
    while (*p == ' ')
        p++;
    return p;
}

static int parse_shape(const char *p, npy_array *a)
{
    if (*p != '(')
        return -1;
    p++;
    a->ndim = 0;
    a->count = 1;
    for (;;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == ')')
            break;
        if (a->ndim == NPY_MAX_DIMS)
            return -1;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0)
            return -1;
        a->shape[a->ndim++] = v;
        if (v > 0 && a->count > INT64_MAX / v)
            return -1;
        a->count *= v;
        p = end;
    }
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
    size_t hlen;
    if (pre[6] == 1) {
        if (fread(pre + 8, 1, 2, f) != 2) {
            fail(err, len, path, "truncated .npy header");
            goto done;
        }
        hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    } else if (pre[6] == 2 || pre[6] == 3) {
        unsigned char l4[4];
        if (fread(l4, 1, 4, f) != 4) {
            fail(err, len, path, "truncated .npy header");
            goto done;
        }
        hlen = (size_t)l4[0] | (size_t)l4[1] << 8 | (size_t)l4[2] << 16 | (size_t)l4[3] << 24;
    } else {
        fail(err, len, path, "unsupported .npy format version");
        goto done;
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
    const char *descr = dict_value(header, "descr");
    const char *order = dict_value(header, "fortran_order");
    const char *shape = dict_value(header, "shape");
    if (!descr || !order || !shape) {
        fail(err, len, path, "malformed .npy header (needs descr, fortran_order and shape)");
        goto done;
    }
    if (strncmp(descr, "'<f4'", 5) != 0) {
        if (strncmp(descr, "'>f4'", 5) == 0)
            fail(err, len, path, "big-endian float32 ('>f4'): byte order must be little-endian ('<f4')");
        else {
            char what[160];
            const char *q = strchr(descr + 1, '\'');
            int n = q ? (int)(q - descr - 1) : 8;
            snprintf(what, sizeof what, "dtype %.*s is not float32 ('<f4')", n > 20 ? 20 : n, descr + 1);
            fail(err, len, path, what);
        }
        goto done;
    }
    if (strncmp(order, "False", 5) != 0) {
        fail(err, len, path, "Fortran-ordered arrays are not supported (use C order)");
        goto done;
    }
    if (parse_shape(shape, a) != 0) {
        fail(err, len, path, "malformed shape in .npy header");
        goto done;
    }
    if ((uint64_t)a->count > (SIZE_MAX / 4)) {
        fail(err, len, path, "array too large");
        goto done;
    }
    a->data = malloc(a->count ? (size_t)a->count * 4 : 4);
    if (!a->data) {
        fail(err, len, path, "out of memory");
        goto done;
    }
    size_t got = fread(a->data, 4, (size_t)a->count, f);
    if (got != (size_t)a->count) {
        char what[160];
        snprintf(what, sizeof what, "truncated data: %zu of %lld float32 values present", got, (long long)a->count);
        fail(err, len, path, what);
        goto done;
    }
    char extra;
    if (fread(&extra, 1, 1, f) != 0) {
        fail(err, len, path, "trailing bytes after the array data");
        goto done;
    }
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

int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err, size_t len)
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
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, len, "%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int bad = fwrite(pre, 1, 10, f) != 10 || fwrite(dict, 1, (size_t)n, f) != (size_t)n;
    for (size_t i = 0; i < pad && !bad; i++)
        bad = fputc(' ', f) == EOF;
    bad = bad || fputc('\n', f) == EOF;
    bad = bad || fwrite(data, 4, (size_t)count, f) != (size_t)count;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        unlink(tmp);
        snprintf(err, len, "%s: cannot write: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
