/*
 * fuzz_npy.c - the .npy reader of `attnres run` (cli/npy.c) on any
 * bytes a user can pass as --sources, --query, --gain and the rest.
 *
 * Invariants: a refusal leaves a zeroed array and a message naming the
 * file; an accepted array has 1..NPY_MAX_DIMS dimensions whose product is
 * its element count, and its data holds that many floats (ASan checks the
 * reads below); the element count can never exceed what the file holds
 * (4 bytes each after the header).
 */
#include <stdio.h>
#include <string.h>

#include "fuzz.h"
#include "npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024], err[512];
    fuzz_write_file("input.npy", data, size, path, sizeof path);
    npy_array a;
    memset(&a, 0x5a, sizeof a);
    err[0] = '\0';
    if (npy_read_f32(path, &a, err, sizeof err) != 0) {
        fuzz_verdict = FUZZ_REFUSED;
        if (!err[0])
            fuzz_fail("refusal without a message", NULL);
        if (a.data || a.count || a.ndim)
            fuzz_fail("refusal leaves a non-zeroed array", err);
        return 0;
    }
    fuzz_verdict = FUZZ_ACCEPTED;
    if (a.ndim < 0 || a.ndim > NPY_MAX_DIMS)
        fuzz_fail("accepted array with a bad ndim", NULL);
    int64_t count = 1;
    for (int i = 0; i < a.ndim; i++) {
        if (a.shape[i] < 0)
            fuzz_fail("accepted array with a negative dimension", NULL);
        count *= a.shape[i];
    }
    if (count != a.count)
        fuzz_fail("element count is not the product of the shape", NULL);
    if ((uint64_t)a.count > size / 4)
        fuzz_fail("more elements than the file holds", NULL);
    if (a.count && !a.data)
        fuzz_fail("accepted array without data", NULL);
    /* Touch every element, so that a short buffer is an ASan report. */
    volatile float sink = 0;
    for (int64_t i = 0; i < a.count; i++)
        sink += a.data[i];
    (void)sink;
    npy_free(&a);
    return 0;
}
