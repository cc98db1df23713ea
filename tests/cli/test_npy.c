/*
 * test_npy.c - the .npy reader (cli/npy.c) reads the header as the
 * Python dict literal it is, as NumPy does, and refuses everything NumPy
 * refuses or that is not plain float32: each case writes its file here, with
 * the header text given byte for byte.
 *
 * usage: test_npy SCRATCH_DIR
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "npy.h"

static char dir[1024];
static char path[1200];

/* Writes a .npy file of format version `version` whose header is exactly
 * `header` (padding and newline included) followed by `floats` float32
 * values 0, 1, 2, ... */
static void write_raw(int version, const char *header, size_t header_len, size_t floats)
{
    snprintf(path, sizeof path, "%s/case.npy", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', (unsigned char)version, 0};
    size_t n = 8;
    if (version == 1) {
        pre[n++] = (unsigned char)(header_len & 0xff);
        pre[n++] = (unsigned char)(header_len >> 8);
    } else {
        for (int k = 0; k < 4; k++)
            pre[n++] = (unsigned char)(header_len >> (8 * k));
    }
    fwrite(pre, 1, n, f);
    fwrite(header, 1, header_len, f);
    for (size_t i = 0; i < floats; i++) {
        float v = (float)i;
        fwrite(&v, 4, 1, f);
    }
    fclose(f);
}

/* Pads a dict text with spaces and a newline so the data is 64-aligned, as
 * NumPy writes it, and writes the file. */
static void write_dict(const char *dict, size_t floats)
{
    char header[4096];
    size_t len = strlen(dict);
    size_t total = 10 + len + 1;
    size_t pad = (64 - total % 64) % 64;
    memcpy(header, dict, len);
    memset(header + len, ' ', pad);
    header[len + pad] = '\n';
    write_raw(1, header, len + pad + 1, floats);
}

static char err[512];

/* Reads the file at `path`: 0 when it was read; the message is in err. */
static int read_it(npy_array *a)
{
    err[0] = 0;
    return npy_read_f32(path, a, err, sizeof err);
}

/* A header that must be read, with the shape given as ndim values. */
static void expect_shape(const char *what, const char *dict, int ndim, const int64_t *shape)
{
    size_t count = 1;
    for (int i = 0; i < ndim; i++)
        count *= (size_t)shape[i];
    write_dict(dict, count);
    npy_array a;
    int rc = read_it(&a);
    if (rc != 0) {
        fprintf(stderr, "%s: refused %s: %s\n", what, dict, err);
        check_failures++;
        return;
    }
    int ok = a.ndim == ndim && a.count == (int64_t)count;
    for (int i = 0; ok && i < ndim; i++)
        ok = a.shape[i] == shape[i];
    for (size_t i = 0; ok && i < count; i++)
        ok = a.data[i] == (float)i;
    if (!ok) {
        fprintf(stderr, "%s: %s read with the wrong shape or data (ndim %d)\n", what, dict, a.ndim);
        check_failures++;
    }
    npy_free(&a);
}

/* A file that must be refused with a message holding `needle`. */
static void expect_refused_file(const char *what, const char *needle)
{
    npy_array a;
    int rc = read_it(&a);
    if (rc == 0) {
        fprintf(stderr, "%s: accepted (ndim %d, count %lld)\n", what, a.ndim, (long long)a.count);
        check_failures++;
        npy_free(&a);
        return;
    }
    check_message_has(what, err, needle);
    if (a.data || a.ndim || a.count) {
        fprintf(stderr, "%s: a refused read left a non-empty array\n", what);
        check_failures++;
    }
}

static void expect_refused(const char *what, const char *dict, size_t floats, const char *needle)
{
    write_dict(dict, floats);
    expect_refused_file(what, needle);
}

static void test_valid_headers(void)
{
    const int64_t s16[] = {16}, s3416[] = {3, 4, 16};
    expect_shape("as numpy writes it", "{'descr': '<f4', 'fortran_order': False, 'shape': (16,), }", 1, s16);
    expect_shape("three dims", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4, 16), }", 3, s3416);
    expect_shape("three dims, trailing comma", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4, 16,)}", 3,
                 s3416);
    expect_shape("no trailing comma in the dict", "{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}", 1,
                 s16);
    expect_shape("double-quoted keys and strings",
                 "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (16,)}", 1, s16);
    expect_shape("keys in another order", "{'shape': (16,), 'fortran_order': False, 'descr': '<f4'}", 1, s16);
    expect_shape("tabs and newlines between tokens",
                 "{'descr':\t'<f4',\n 'fortran_order' : False ,\n 'shape' : ( 3 ,4,\t16 ) }", 3, s3416);
    expect_shape("a repeated key takes the last value (True, then False)",
                 "{'descr': '<f4', 'fortran_order': True, 'fortran_order': False, 'shape': (16,)}", 1, s16);
    expect_shape("a scalar, shape ()", "{'descr': '<f4', 'fortran_order': False, 'shape': ()}", 0, NULL);
    expect_shape("digits with underscores, as Python allows", "{'descr': '<f4', 'fortran_order': False, 'shape': (1_6,)}",
                 1, s16);
    const int64_t s0[] = {0, 16};
    expect_shape("an empty array", "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 16)}", 2, s0);
}

static void test_versions(void)
{
    const char *h = "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }\n";
    write_raw(2, h, strlen(h), 4);
    npy_array a;
    CHECK(read_it(&a) == 0 && a.count == 4);
    npy_free(&a);
    write_raw(3, h, strlen(h), 4);
    CHECK(read_it(&a) == 0 && a.count == 4);
    npy_free(&a);
    write_raw(4, h, strlen(h), 4);
    expect_refused_file("format version 4", "version");
    /* The minor version must be 0, as NumPy requires. */
    write_raw(1, h, strlen(h), 4);
    FILE *f = fopen(path, "r+b");
    fseek(f, 7, SEEK_SET);
    fputc(1, f);
    fclose(f);
    expect_refused_file("format version 1.1", "version");
}

static void test_refused_headers(void)
{
    static const struct {
        const char *what, *dict;
        size_t floats; /* values of data after the header */
        const char *needle;
    } refused[] = {
        {"a repeated key takes the last value (False, then True)",
         "{'descr': '<f4', 'fortran_order': False, 'fortran_order': True, 'shape': (16,)}", 16, "Fortran"},
        {"junk in the padding",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}  x", 16, "after the header"},
        {"junk after the closing brace",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}}", 16, "after the header"},
        {"shape (16) is an int, not a tuple",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16)}", 16, "shape"},
        {"shape without commas",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (3 4 16)}", 192, "shape"},
        {"shape with two commas",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,,)}", 16, "shape"},
        {"shape (,)",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", 1, "shape"},
        {"shape as a list",
         "{'descr': '<f4', 'fortran_order': False, 'shape': [16]}", 16, "shape"},
        {"shape with a leading zero",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (016,)}", 16, "shape"},
        {"negative dimension",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (-16,)}", 16, "shape"},
        {"dimension beyond int64",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 0, "shape"},
        {"element count beyond int64",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", 0, "large"},
        {"Falsey",
         "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (16,)}", 16, "fortran_order"},
        {"fortran_order as a string",
         "{'descr': '<f4', 'fortran_order': 'False', 'shape': (16,)}", 16, "fortran_order"},
        {"fortran_order 0",
         "{'descr': '<f4', 'fortran_order': 0, 'shape': (16,)}", 16, "fortran_order"},
        {"an unknown key",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,), 'x': 1}", 16, "'x'"},
        {"a missing key",
         "{'descr': '<f4', 'shape': (16,)}", 16, "fortran_order"},
        {"an empty dict",
         "{}", 0, "descr"},
        {"a dict with only a comma",
         "{,}", 0, "header"},
        {"two trailing commas",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,),,}", 16, "header"},
        {"a missing colon",
         "{'descr' '<f4', 'fortran_order': False, 'shape': (16,)}", 16, "header"},
        {"an unterminated string",
         "{'descr: '<f4', 'fortran_order': False, 'shape': (16,)}", 16, "header"},
        {"mismatched quotes",
         "{'descr\": '<f4', 'fortran_order': False, 'shape': (16,)}", 16, "header"},
        {"not a dict",
         "['descr', '<f4']", 16, "header"},
        {"float64",
         "{'descr': '<f8', 'fortran_order': False, 'shape': (16,)}", 32, "not float32"},
        {"big-endian",
         "{'descr': '>f4', 'fortran_order': False, 'shape': (16,)}", 16, "byte order"},
        {"a structured dtype",
         "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (16,)}", 16, "not float32"},
        {"Fortran order",
         "{'descr': '<f4', 'fortran_order': True, 'shape': (16,)}", 16, "Fortran"},
        /* Data that does not match the shape. */
        {"data short by one value",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}", 15, "truncated"},
        {"data long by one value",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}", 17, "trailing"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        expect_refused(refused[i].what, refused[i].dict, refused[i].floats, refused[i].needle);
    /* A NUL byte inside the header, which Python refuses to evaluate. */
    const char nul[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (16,)}\0   \n";
    write_raw(1, nul, sizeof nul - 1, 16);
    expect_refused_file("a NUL byte in the padding", "header");
}

/* A tiny file whose header claims 2^40 elements (4 TiB) is refused from its
 * size alone, at once and without trying to allocate the 4 TiB. */
static void test_size_checked_before_allocating(void)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect_refused("2^40 elements in a 100-byte file",
                   "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,)}", 4, "truncated");
    CHECK(strstr(err, "memory") == NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec) < 1.0);
}

/* What npy_write_f32 writes, npy_read_f32 reads back. */
static void test_round_trip(void)
{
    float v[12];
    for (int i = 0; i < 12; i++)
        v[i] = (float)i * 0.5f;
    const int64_t shape[] = {3, 4};
    snprintf(path, sizeof path, "%s/rt.npy", dir);
    REQUIRE(npy_write_f32(path, v, 2, shape, err, sizeof err) == 0);
    npy_array a;
    REQUIRE(read_it(&a) == 0);
    CHECK(a.ndim == 2 && a.shape[0] == 3 && a.shape[1] == 4 && a.count == 12);
    CHECK(memcmp(a.data, v, sizeof v) == 0);
    npy_free(&a);
    const int64_t one[] = {5};
    REQUIRE(npy_write_f32(path, v, 1, one, err, sizeof err) == 0);
    REQUIRE(read_it(&a) == 0);
    CHECK(a.ndim == 1 && a.shape[0] == 5);
    npy_free(&a);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (check_usage(argc, argv, 1, "SCRATCH_DIR"))
        return 2;
    snprintf(dir, sizeof dir, "%s", argc == 2 ? argv[1] : ".");
    RUN_CASE(test_valid_headers);
    RUN_CASE(test_versions);
    RUN_CASE(test_refused_headers);
    RUN_CASE(test_size_checked_before_allocating);
    RUN_CASE(test_round_trip);
    CHECK_EXIT();
}
