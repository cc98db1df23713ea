/* device.c - opening devices and the helpers every backend shares. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "errmsg.h"
#include "sha256.h"

int ar_device_fail(attnres_device *dev, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ar_errmsg_vset(dev->err_id, fmt, ap);
    va_end(ap);
    return status;
}

const char *attnres_device_errmsg(attnres_device *dev)
{
    return dev ? ar_errmsg_get(dev->err_id) : "no device";
}

/* Parses "cpu", "cpu:0", "cuda", "cuda:N". */
static int parse_spec(const char *spec, const ar_backend **ops, int *index)
{
    if (!spec)
        return -1;
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    *index = 0;
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (!colon[1] || *end || v < 0 || v > 1024)
            return -1;
        *index = (int)v;
    }
    if (len == 3 && strncmp(spec, "cpu", 3) == 0)
        *ops = &ar_cpu_backend;
    else if (len == 4 && strncmp(spec, "cuda", 4) == 0)
        *ops = &ar_cuda_backend;
    else
        return -1;
    return 0;
}

int ar_handle_call_start(const void *out, char **msg, size_t *msg_len, char *scratch, size_t scratch_len)
{
    if (!*msg) {
        *msg = scratch;
        *msg_len = scratch_len;
    }
    if (!out) {
        snprintf(*msg, *msg_len, "out is NULL");
        return ATTNRES_EINVAL;
    }
    return ATTNRES_OK;
}

int attnres_device_open(const char *spec, attnres_device **out, char *msg,
                        size_t msg_len)
{
    char scratch[8];
    if (ar_handle_call_start(out, &msg, &msg_len, scratch, sizeof scratch) != ATTNRES_OK)
        return ATTNRES_EINVAL;
    *out = NULL;
    const ar_backend *ops;
    int index;
    if (parse_spec(spec, &ops, &index) != 0) {
        snprintf(msg, msg_len, "unknown device '%s' (expected cpu, cuda or cuda:N)", spec ? spec : "(null)");
        return ATTNRES_EINVAL;
    }
    attnres_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        snprintf(msg, msg_len, "out of memory");
        return ATTNRES_ENOMEM;
    }
    dev->ops = ops;
    dev->index = index;
    dev->err_id = ar_errmsg_new_id();
    pthread_mutex_init(&dev->lock, NULL);
    int rc = ops->open(dev, index);
    if (rc != ATTNRES_OK) {
        snprintf(msg, msg_len, "%s", ar_errmsg_get(dev->err_id));
        ar_errmsg_forget(dev->err_id);
        pthread_mutex_destroy(&dev->lock);
        free(dev);
        return rc;
    }
    /* A simulated device's fingerprint carries "simulated", so that it can
     * never equal a real device's whatever name the simulator reports. */
    snprintf(dev->fingerprint, sizeof dev->fingerprint, "%s|%s|%s|%d|%lld|%s%s", dev->backend, dev->name, dev->arch,
             dev->units, (long long)dev->memory, dev->driver, dev->simulated ? "|simulated" : "");
    *out = dev;
    return ATTNRES_OK;
}

void attnres_device_close(attnres_device *dev)
{
    if (!dev)
        return;
    dev->ops->close(dev);
    ar_errmsg_forget(dev->err_id);
    pthread_mutex_destroy(&dev->lock);
    free(dev);
}

int attnres_device_count(const char *backend)
{
    if (!backend)
        return 0;
    if (strcmp(backend, "cpu") == 0)
        return 1;
    if (strcmp(backend, "cuda") == 0)
        return ar_cuda_backend.count();
    return 0;
}

int attnres_device_info_get(attnres_device *dev, attnres_device_info *info)
{
    if (!dev || !info)
        return ATTNRES_EINVAL;
    char msg[300];
    size_t got = info->struct_size;
    if (ar_struct_size_check(got, AR_DEVICE_INFO_SIZE_0_2, sizeof *info, "attnres_device_info",
                             "{.struct_size = sizeof(attnres_device_info)}", msg, sizeof msg))
        return ar_device_fail(dev, ATTNRES_EINVAL, "%s", msg);
    /* Filled in full here, and only the caller's bytes copied out: an
     * older caller's struct ends sooner. */
    attnres_device_info all = {
        .struct_size = got,
        .backend = dev->backend,
        .name = dev->name,
        .arch = dev->arch,
        .units = dev->units,
        .memory = dev->memory,
        .driver = dev->driver,
        .fingerprint = dev->fingerprint,
        .simulated = dev->simulated,
    };
    memcpy(info, &all, got);
    return ATTNRES_OK;
}

const char *ar_op_name(attnres_op op)
{
    static const char *const names[AR_OPS] = {"mix",          "phase1",          "phase2",
                                              "mix_backward", "phase1_backward", "phase2_backward"};
    return (int)op >= 0 && (int)op < AR_OPS ? names[op] : "unknown";
}

int ar_kernel_abi_ok(const int versions[AR_OPS], int64_t abi, int64_t op, char *why, size_t why_len)
{
    if (op == -1) {
        if (abi == 1 && versions[0] == 1 && versions[1] == 1 && versions[2] == 1)
            return 1;
        snprintf(why, why_len,
                 "it has ABI %lld and no op tag (built before per-op ABI versions); this library speaks mix %d, "
                 "phase1 %d, phase2 %d",
                 (long long)abi, versions[0], versions[1], versions[2]);
        return 0;
    }
    /* A version of 0 means the backend has no kernels of that op. */
    if (op < 0 || op >= AR_OPS || versions[op] == 0) {
        snprintf(why, why_len, "its ABI op tag %lld names no op", (long long)op);
        return 0;
    }
    if (abi == versions[op])
        return 1;
    snprintf(why, why_len, "it has %s ABI %lld, this library speaks %d", ar_op_name((attnres_op)op), (long long)abi, versions[op]);
    return 0;
}

/* Where the value of "key": starts in a flat JSON object, or NULL. */
static const char *json_value(const char *json, const char *key)
{
    if (!json)
        return NULL;
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    const char *p = strstr(json, pattern);
    return p ? p + strlen(pattern) : NULL;
}

double ar_json_double(const char *json, const char *key, double fallback)
{
    const char *p = json_value(json, key);
    if (!p)
        return fallback;
    char *end;
    double v = strtod(p, &end);
    return end == p ? fallback : v;
}

int64_t ar_json_int(const char *json, const char *key, int64_t fallback)
{
    const char *p = json_value(json, key);
    if (!p)
        return fallback;
    char *end;
    long long v = strtoll(p, &end, 10);
    return end == p ? fallback : (int64_t)v;
}

void ar_build_key(const attnres_device *dev, const char *source_hash, char key[65])
{
    ar_sha256 s;
    ar_sha256_init(&s);
    const char *parts[] = {source_hash, dev->compiler, dev->options, dev->target};
    /* The target changes (CUDA: to PTX) under the device lock while other
     * threads may be planning on the device. */
    pthread_mutex_t *lock = (pthread_mutex_t *)&dev->lock;
    pthread_mutex_lock(lock);
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        ar_sha256_update(&s, parts[i], strlen(parts[i]));
        ar_sha256_update(&s, "\n", 1);
    }
    pthread_mutex_unlock(lock);
    ar_sha256_hex(&s, key);
}

int ar_backward_workspace_fits(attnres_device *dev, int64_t row, int64_t T, int epilogue, const void *ws,
                               size_t size, ar_backward_ws *out)
{
    *out = (ar_backward_ws){0}; /* a size that does not fit says 0, not garbage */
    if (ar_mix_backward_workspace(row, T, epilogue, out) != 0 || (T > 0 && (!ws || size < out->bytes)))
        return ar_device_fail(dev, ATTNRES_EINVAL, "the workspace holds %zu bytes; T = %lld needs %zu",
                              ws ? size : 0, (long long)T, out->bytes);
    return ATTNRES_OK;
}
