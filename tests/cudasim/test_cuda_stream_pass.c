/*
 * test_cuda_stream_pass.c - the CUDA backend's stream pass (the ceiling a
 * kernel is timed next to, tuner/src/paired_stream.c): that a pass really
 * runs the grid-stride kernels and the driver's copy over the bytes its
 * steps name (a copy writes them right after, a read writes nothing), that
 * it refuses steps it cannot run with a message that names them, and that
 * the tuner's pass for a kernel out of cache takes the run's fastest CUDA
 * points and runs. The kernels are NVRTC's PTX, launched through the
 * backend; under ctest the device is the simulated driver, whose times are
 * a model: nothing here holds a time to a figure.
 *
 * Skips (exit 77) when NVRTC cannot be loaded, or when no CUDA device is
 * present and ATTNRES_CUDA_DRIVER is unset.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "device.h"
#include "nvrtc.h"
#include "paired_stream.h"
#include "device_ceilings.h"
#include "test_cuda_open.h"
#include "test_stream_steps.h"

static attnres_device *dev;

/* 64 KiB a step: the simulator interprets every load. */
enum { STEP = 64 << 10 };

/* Fills a device buffer of `bytes` with the pattern of byte i; 0 on success. */
static int fill(void *dptr, size_t bytes, unsigned char (*pattern)(size_t))
{
    unsigned char *host = malloc(bytes);
    if (!host)
        return -1;
    for (size_t i = 0; i < bytes; i++)
        host[i] = pattern(i);
    int rc = dev->ops->copy_to_device(dev, dptr, host, bytes);
    free(host);
    return rc;
}

static unsigned char source_byte(size_t i) { return (unsigned char)(i * 7 + 3); }
static unsigned char zero_byte(size_t i)
{
    (void)i;
    return 0;
}
static unsigned char read_byte(size_t i) { return (unsigned char)(i * 5 + 1); }

/* A copy step (the grid-stride kernel, then the driver's) writes its bytes
 * right after the ones it reads; a read step at 4 blocks per SM leaves its
 * bytes as they were; the pass takes time. */
static void test_pass_copies_and_reads(void)
{
    const size_t n = STEP;
    void *mem = NULL;
    REQUIRE(dev->ops->mem_alloc(dev, 3 * n, &mem) == ATTNRES_OK);
    unsigned char *host = malloc(3 * n);
    REQUIRE(host != NULL);
    const struct {
        const char *kernel;
        int blocks;
    } copies[] = {{"copy", 2}, {"memcpy-dtod", 0}};
    for (size_t k = 0; k < sizeof copies / sizeof copies[0]; k++) {
        REQUIRE(fill(mem, n, source_byte) == 0);
        REQUIRE(fill((char *)mem + n, n, zero_byte) == 0);
        REQUIRE(fill((char *)mem + 2 * n, n, read_byte) == 0);
        ar_stream_pass pass = {{{copies[k].kernel, copies[k].blocks, 0, n}, {"read", 4, 2 * n, n}}};
        double us = 0;
        const int rc = dev->ops->stream_pass(dev, mem, &pass, &us);
        CHECK(rc == ATTNRES_OK && us > 0);
        if (rc != ATTNRES_OK)
            fprintf(stderr, "  %s: %s\n", copies[k].kernel, attnres_device_errmsg(dev));
        REQUIRE(dev->ops->copy_to_host(dev, host, mem, 3 * n) == ATTNRES_OK);
        CHECK(memcmp(host, host + n, n) == 0);
        int source_intact = 1, read_intact = 1;
        for (size_t i = 0; i < n; i++) {
            source_intact &= host[i] == source_byte(i);
            read_intact &= host[2 * n + i] == read_byte(i);
        }
        CHECK(source_intact && read_intact);
    }
    free(host);
    dev->ops->mem_free(dev, mem);
}

/* Steps the pass cannot run are refused before anything is launched, with
 * a message that names the step and what is wrong with it. */
static void test_bad_steps_are_refused(void)
{
    void *mem = NULL;
    REQUIRE(dev->ops->mem_alloc(dev, 2 * STEP, &mem) == ATTNRES_OK);
    static const test_bad_step bad[] = {
        {{"copy-nt", 4, 0, 4096}, "no streaming kernel 'copy-nt'"},
        {{"read", 0, 0, 4096}, "0 blocks per SM; it takes 1 to 32"},
        {{"copy", 33, 0, 4096}, "33 blocks per SM"},
        {{"memcpy-dtod", 4, 0, 4096}, "takes 0 blocks per SM, not 4"},
        {{"read", 4, 0, 1000}, "1000 bytes at offset 0"},
        {{"read", 4, 32, 4096}, "4096 bytes at offset 32"},
        {{"read", 4, 0, 0}, "positive multiple of 4096"},
    };
    const ar_stream_step lead = {"read", 4, 0, 4096};
    test_bad_steps_refused(dev, mem, &lead, bad, sizeof bad / sizeof bad[0]);
    /* The kernels load 16-byte vectors: a misaligned buffer is refused, not
     * faulted on. */
    ar_stream_pass pass = {{{"read", 4, 0, 4096}}};
    double us = 0;
    CHECK(dev->ops->stream_pass(dev, (char *)mem + 8, &pass, &us) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_device_errmsg(dev), "not 16-byte aligned") != NULL);
    dev->ops->mem_free(dev, mem);
}

/* The run's CUDA ceilings as cuda_ceilings records them, with a cache small
 * enough that the kernel below is out of it. */
static device_ceilings cuda_ceilings_of_a_run(void)
{
    device_ceilings r = {.copy_gbps = 3000.0, .read_gbps = 3800.0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"memcpy-dtod", AR_CEILING_COPY, 0, 3000.0, 3000.0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"read", AR_CEILING_READ, 2, 3500.0, 3500.0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"copy", AR_CEILING_COPY, 2, 2800.0, 2800.0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"read", AR_CEILING_READ, 4, 3800.0, 3800.0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"copy", AR_CEILING_COPY, 4, 2900.0, 2900.0};
    r.ceil.fma_gflops = NAN;
    r.ceil.cache_bytes = 65536.0;
    return r;
}

/* A kernel that reads nine rows and writes one: the pass copies the writes
 * with the driver's copy (the fastest copy point, no blocks) and reads the
 * rest with the read kernel at its fastest 4 blocks per SM, in whole pages,
 * names them so, and runs on the device. */
static void test_tuner_pass_on_cuda(void)
{
    device_ceilings r = cuda_ceilings_of_a_run();
    paired_stream *ps = NULL;
    char err[256];
    REQUIRE(paired_stream_create(dev, &r, 9.0 * STEP, 1.0 * STEP, &ps, err, sizeof err) == 1);
    const ar_stream_step *w = &ps->pass.step[0], *rd = &ps->pass.step[1];
    CHECK(strcmp(w->kernel, "memcpy-dtod") == 0 && w->threads == 0 && w->offset == 0 && w->bytes == STEP);
    CHECK(strcmp(rd->kernel, "read") == 0 && rd->threads == 4 && rd->offset == 2 * (size_t)STEP);
    CHECK(rd->bytes == 8 * (size_t)STEP && ps->bytes == 10.0 * STEP);
    char text[256];
    paired_stream_describe(ps, text, sizeof text);
    CHECK(strcmp(text, "memcpy-dtod over 0.07 MB + read at 4 blocks per SM over 0.52 MB") == 0);
    if (strcmp(text, "memcpy-dtod over 0.07 MB + read at 4 blocks per SM over 0.52 MB") != 0)
        fprintf(stderr, "  described as: %s\n", text);
    double us = 0;
    CHECK(paired_stream_run(dev, ps, &us) == ATTNRES_OK && us > 0);
    paired_stream_free(dev, ps);
    /* The same kernel on the CPU device's terms is not what CUDA runs. */
    r.ceil.pt[0].kernel = "copy-nt";
    r.ceil.pt[0].threads = 2;
    REQUIRE(paired_stream_create(dev, &r, 9.0 * STEP, 1.0 * STEP, &ps, err, sizeof err) == 1);
    CHECK(paired_stream_run(dev, ps, &us) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_device_errmsg(dev), "no streaming kernel 'copy-nt'") != NULL);
    paired_stream_free(dev, ps);
}

/* The cases, run once the device is open, or at once under --list. */
static void run_cases(void)
{
    RUN_CASE(test_pass_copies_and_reads);
    RUN_CASE(test_bad_steps_are_refused);
    RUN_CASE(test_tuner_pass_on_cuda);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (check_listing) { /* needs neither NVRTC nor a device */
        run_cases();
        CHECK_EXIT();
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    const int skip_or_fail = test_cuda_open(&dev);
    if (skip_or_fail)
        return skip_or_fail;
    printf("device cuda:0: %s%s, %d SMs\n", dev->name, dev->simulated ? " (simulated)" : "", dev->units);
    run_cases();
    attnres_device_close(dev);
    CHECK_EXIT();
}
