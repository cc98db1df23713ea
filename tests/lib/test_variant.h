/*
 * test_variant.h - compiling and loading one template variant on a device
 * as the tuner does (emit, compile, load), for the tests that run tuned
 * variants against the reference (backend_ops).
 * Header-only.
 */
#ifndef ATTNRES_TEST_VARIANT_H
#define ATTNRES_TEST_VARIANT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argen.h"
#include "device.h"
#include "sha256.h"
#include "test_device.h"
#include "test_scratch.h"

/* Makes a scratch directory "$TMPDIR/attnres-test-NAME-XXXXXX" in dir
 * (len bytes), points ATTNRES_CACHE_DIR at a cache inside it, and opens
 * the CPU device as *dev; 0 on success, else the failure is printed.
 * scratch_remove (test_scratch.h) removes it. */
static inline int scratch_cpu_open(const char *name, char *dir, size_t len, attnres_device **dev)
{
    if (scratch_make(name, dir, len) != 0)
        return -1;
    char cache[4200];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("ATTNRES_CACHE_DIR", cache, 1);
    return test_cpu_open(dev);
}

/* Compiles and loads variant id of template g on dev, its source
 * specialized for spec (argen_specialize's form; NULL: the general one);
 * 0 on success, else the failure is printed with the variant's id. */
static inline int compile_variant_for(attnres_device *dev, argen *g, const char *id, const char *spec, ar_kernel *k)
{
    char *src = NULL, *name = NULL, *json = NULL, *log = NULL;
    void *blob = NULL;
    size_t size = 0;
    memset(k, 0, sizeof *k);
    int rc = argen_emit_for(g, id, spec, &src, &name, &json);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", id, argen_errmsg(g));
        return rc;
    }
    rc = dev->ops->compile(dev, src, name, &blob, &size, &log);
    /* Loaded under its build key, as the tuner loads it: two sources with
     * one kernel name (a general one and a specialized one) are two
     * objects, where a load under the kernel's name would reuse the first. */
    char hash[65];
    ar_sha256_string(src, hash);
    ar_build_key(dev, hash, k->build_key);
    if (rc == 0)
        rc = dev->ops->load(dev, blob, size, src, name, json, k);
    if (rc)
        fprintf(stderr, "  %s: %s\n", id, attnres_device_errmsg(dev));
    free(src);
    free(name);
    free(json);
    free(log);
    free(blob);
    return rc;
}

/* compile_variant_for's general source. */
static inline int compile_variant_on(attnres_device *dev, argen *g, const char *id, ar_kernel *k)
{
    return compile_variant_for(dev, g, id, NULL, k);
}

#endif
