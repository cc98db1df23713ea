/* nvrtc.c - NVRTC through dlopen; see nvrtc.h. */
#define _GNU_SOURCE
#include "nvrtc.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"

/* The few NVRTC types and entry points used, declared here so that the
 * library builds without the CUDA toolkit's headers. */
typedef int nvrtc_result; /* nvrtcResult; 0 is NVRTC_SUCCESS */
typedef struct nvrtc_program_st *nvrtc_program;
enum { NVRTC_OK = 0, NVRTC_OUT_OF_MEMORY = 1, NVRTC_INVALID_OPTION = 5 };

static struct {
    pthread_once_t once;
    void *handle;
    char error[512];
    char path[512];
    int major, minor;
    const char *(*GetErrorString)(nvrtc_result);
    nvrtc_result (*Version)(int *, int *);
    nvrtc_result (*GetNumSupportedArchs)(int *);
    nvrtc_result (*GetSupportedArchs)(int *);
    nvrtc_result (*CreateProgram)(nvrtc_program *, const char *, const char *,
                                  int, const char *const *, const char *const *);
    nvrtc_result (*DestroyProgram)(nvrtc_program *);
    nvrtc_result (*CompileProgram)(nvrtc_program, int, const char *const *);
    nvrtc_result (*GetPTXSize)(nvrtc_program, size_t *);
    nvrtc_result (*GetPTX)(nvrtc_program, char *);
    nvrtc_result (*GetCUBINSize)(nvrtc_program, size_t *);
    nvrtc_result (*GetCUBIN)(nvrtc_program, char *);
    nvrtc_result (*GetProgramLogSize)(nvrtc_program, size_t *);
    nvrtc_result (*GetProgramLog)(nvrtc_program, char *);
} nv = {.once = PTHREAD_ONCE_INIT};

static void *try_open(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h)
        snprintf(nv.path, sizeof nv.path, "%.400s", path);
    return h;
}

static void *open_library(void)
{
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", NULL};
    for (const char *const *n = names; *n; n++) {
        void *h = try_open(*n);
        if (h)
            return h;
    }
    const char *dirs[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda", NULL};
    for (int i = 0; i < 3; i++) {
        if (!dirs[i] || !*dirs[i])
            continue;
        for (const char *const *n = names; *n; n++) {
            char path[600];
            snprintf(path, sizeof path, "%s/lib64/%s", dirs[i], *n);
            void *h = try_open(path);
            if (h)
                return h;
        }
    }
    return NULL;
}

#define NV_SYM(field, symbol, required)                                                   \
    do {                                                                                  \
        *(void **)(&nv.field) = dlsym(nv.handle, symbol);                                 \
        if (!nv.field && (required)) {                                                    \
            snprintf(nv.error, sizeof nv.error, "%.400s lacks %.60s (too old an NVRTC?)",        \
                     nv.path, symbol);                                                    \
            goto fail;                                                                    \
        }                                                                                 \
    } while (0)

static void load_once(void)
{
    nv.handle = open_library();
    if (!nv.handle) {
        snprintf(nv.error, sizeof nv.error,
                 "NVRTC not found (tried libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so and "
                 "$CUDA_HOME/lib64, /usr/local/cuda/lib64)");
        return;
    }
    NV_SYM(GetErrorString, "nvrtcGetErrorString", 1);
    NV_SYM(Version, "nvrtcVersion", 1);
    NV_SYM(GetNumSupportedArchs, "nvrtcGetNumSupportedArchs", 0);
    NV_SYM(GetSupportedArchs, "nvrtcGetSupportedArchs", 0);
    NV_SYM(CreateProgram, "nvrtcCreateProgram", 1);
    NV_SYM(DestroyProgram, "nvrtcDestroyProgram", 1);
    NV_SYM(CompileProgram, "nvrtcCompileProgram", 1);
    NV_SYM(GetPTXSize, "nvrtcGetPTXSize", 1);
    NV_SYM(GetPTX, "nvrtcGetPTX", 1);
    NV_SYM(GetCUBINSize, "nvrtcGetCUBINSize", 0);
    NV_SYM(GetCUBIN, "nvrtcGetCUBIN", 0);
    NV_SYM(GetProgramLogSize, "nvrtcGetProgramLogSize", 1);
    NV_SYM(GetProgramLog, "nvrtcGetProgramLog", 1);
    if (nv.Version(&nv.major, &nv.minor) != NVRTC_OK) {
        snprintf(nv.error, sizeof nv.error, "%.400s: nvrtcVersion failed", nv.path);
        goto fail;
    }
    return;
fail:
    dlclose(nv.handle);
    nv.handle = NULL;
}

static int ready(char *err, size_t errlen)
{
    pthread_once(&nv.once, load_once);
    if (nv.handle)
        return 0;
    if (err && errlen)
        snprintf(err, errlen, "%s", nv.error);
    return -1;
}

int ar_nvrtc_available(char *err, size_t errlen) { return ready(err, errlen); }

int ar_nvrtc_version(int *major, int *minor)
{
    if (ready(NULL, 0))
        return -1;
    if (major)
        *major = nv.major;
    if (minor)
        *minor = nv.minor;
    return 0;
}

void ar_nvrtc_identity(char *buf, size_t len)
{
    if (ready(NULL, 0))
        snprintf(buf, len, "NVRTC unavailable");
    else
        snprintf(buf, len, "NVRTC %d.%d", nv.major, nv.minor);
}

int ar_nvrtc_best_arch(int want)
{
    if (ready(NULL, 0) || !nv.GetNumSupportedArchs || !nv.GetSupportedArchs)
        return 0;
    int n = 0;
    if (nv.GetNumSupportedArchs(&n) != NVRTC_OK || n <= 0 || n > 4096)
        return 0;
    int *archs = malloc((size_t)n * sizeof *archs);
    if (!archs)
        return 0;
    int best = 0;
    if (nv.GetSupportedArchs(archs) == NVRTC_OK)
        for (int i = 0; i < n; i++)
            if (archs[i] <= want && archs[i] > best)
                best = archs[i];
    free(archs);
    return best;
}

/* ---- the ptxas report ------------------------------------------------ */

static int number_before(const char *line, const char *word)
{
    const char *p = strstr(line, word);
    if (!p)
        return -1;
    while (p > line && p[-1] == ' ')
        p--;
    const char *e = p;
    while (p > line && p[-1] >= '0' && p[-1] <= '9')
        p--;
    if (p == e)
        return -1;
    return atoi(p);
}

static int number_after(const char *line, const char *word)
{
    const char *p = strstr(line, word);
    if (!p)
        return -1;
    p += strlen(word);
    while (*p == ' ')
        p++;
    if (*p < '0' || *p > '9')
        return -1;
    return atoi(p);
}

static void resources_json(ar_resources *r)
{
    snprintf(r->json, sizeof r->json,
             "{\"registers\":%d,\"spill_stores\":%d,\"spill_loads\":%d,\"smem\":%d,\"stack\":%d}",
             r->registers, r->spill_stores, r->spill_loads, r->smem, r->stack);
}

/*
 * ptxas --verbose writes, per entry function:
 *   ptxas info    : Compiling entry function 'NAME' for 'sm_90'
 *   ptxas info    : Function properties for NAME
 *       0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 40 registers, used 1 barriers, 1136 bytes cmem[0], 512 bytes smem
 * (the exact set of items on the "Used" line differs between versions).
 */
int ar_nvrtc_parse_resources(const char *log, const char *kernel, ar_resources *res)
{
    res->registers = res->spill_stores = res->spill_loads = res->smem = res->stack = -1;
    resources_json(res);
    if (!log)
        return -1;
    int found = 0;
    const char *line = log;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), line);
        const char *entry = strstr(buf, "Compiling entry function '");
        if (entry) {
            if (found)
                break; /* the next kernel's report begins */
            entry += strlen("Compiling entry function '");
            size_t nlen = strcspn(entry, "'");
            if (!kernel || (strlen(kernel) == nlen && strncmp(entry, kernel, nlen) == 0))
                found = 1;
        } else if (found) {
            int v;
            if ((v = number_before(buf, "bytes stack frame")) >= 0)
                res->stack = v;
            if ((v = number_before(buf, "bytes spill stores")) >= 0)
                res->spill_stores = v;
            if ((v = number_before(buf, "bytes spill loads")) >= 0)
                res->spill_loads = v;
            if (strstr(buf, "Used ")) {
                if ((v = number_after(buf, "Used")) >= 0)
                    res->registers = v;
                res->smem = (v = number_before(buf, "bytes smem")) >= 0 ? v : 0;
            }
        }
        line = end ? end + 1 : line + len;
    }
    if (!found)
        return -1;
    if (res->spill_stores < 0)
        res->spill_stores = 0;
    if (res->spill_loads < 0)
        res->spill_loads = 0;
    if (res->stack < 0)
        res->stack = 0;
    resources_json(res);
    return res->registers >= 0 ? 0 : -1;
}

int ar_nvrtc_parse_module_resources(const char *log, ar_resources *res)
{
    static const char tag[] = "Compiling entry function '";
    int found = 0;
    ar_resources worst;
    worst.registers = worst.spill_stores = worst.spill_loads = worst.smem = worst.stack = -1;
    for (const char *p = log ? strstr(log, tag) : NULL; p; p = strstr(p + 1, tag)) {
        const char *name = p + sizeof tag - 1;
        const size_t len = strcspn(name, "'");
        char kernel[256];
        if (len >= sizeof kernel)
            continue;
        memcpy(kernel, name, len);
        kernel[len] = 0;
        ar_resources r;
        if (ar_nvrtc_parse_resources(log, kernel, &r) != 0)
            continue;
        found = 1;
        if (r.registers > worst.registers)
            worst.registers = r.registers;
        if (r.spill_stores > worst.spill_stores)
            worst.spill_stores = r.spill_stores;
        if (r.spill_loads > worst.spill_loads)
            worst.spill_loads = r.spill_loads;
        if (r.smem > worst.smem)
            worst.smem = r.smem;
        if (r.stack > worst.stack)
            worst.stack = r.stack;
    }
    if (!found) /* res as the parser leaves it when it finds no report */
        return ar_nvrtc_parse_resources(NULL, NULL, res);
    *res = worst;
    resources_json(res);
    return 0;
}

/* ---- compiling ------------------------------------------------------- */

/* "sm_90", "sm_90a", "compute_90" or "90" -> "90" / "90a"; 0 if invalid. */
static int arch_digits(const char *arch, char *out, size_t len)
{
    if (!arch)
        return -1;
    if (strncmp(arch, "sm_", 3) == 0)
        arch += 3;
    else if (strncmp(arch, "compute_", 8) == 0)
        arch += 8;
    size_t n = strspn(arch, "0123456789");
    if (n < 2 || n > 4 || strlen(arch + n) > 1 || (arch[n] && (arch[n] < 'a' || arch[n] > 'z')))
        return -1;
    snprintf(out, len, "%s", arch);
    return 0;
}

static char *take_log(nvrtc_program prog)
{
    size_t n = 0;
    if (nv.GetProgramLogSize(prog, &n) != NVRTC_OK || n <= 1)
        return NULL;
    char *text = malloc(n + 1);
    if (!text)
        return NULL;
    if (nv.GetProgramLog(prog, text) != NVRTC_OK) {
        free(text);
        return NULL;
    }
    text[n] = 0;
    return text;
}

int ar_nvrtc_compile(const char *source, const char *name, const char *arch,
                     int want_cubin, void **blob, size_t *size, char **log,
                     ar_resources *res, char *err, size_t errlen)
{
    char scratch[8];
    if (!err || !errlen) {
        err = scratch;
        errlen = sizeof scratch;
    }
    err[0] = 0;
    if (blob)
        *blob = NULL;
    if (size)
        *size = 0;
    if (log)
        *log = NULL;
    if (res) {
        res->registers = res->spill_stores = res->spill_loads = res->smem = res->stack = -1;
        resources_json(res);
    }
    if (ready(err, errlen))
        return ATTNRES_EUNSUPPORTED;
    if (!source) {
        snprintf(err, errlen, "no source to compile");
        return ATTNRES_EINVAL;
    }
    char digits[16];
    if (arch_digits(arch, digits, sizeof digits)) {
        snprintf(err, errlen, "invalid GPU architecture '%s' (expected sm_XX)", arch ? arch : "(null)");
        return ATTNRES_EINVAL;
    }
    if (want_cubin && (!nv.GetCUBINSize || !nv.GetCUBIN)) {
        snprintf(err, errlen, "%.400s cannot produce cubins (NVRTC %d.%d)", nv.path, nv.major, nv.minor);
        return ATTNRES_EUNSUPPORTED;
    }
    char gpu[64];
    snprintf(gpu, sizeof gpu, "--gpu-architecture=%s_%s", want_cubin ? "sm" : "compute", digits);
    const char *opts[] = {gpu, "-std=c++17", "-default-device", "--fmad=true", "-Xptxas", "--verbose"};
    int nopts = want_cubin ? 6 : 4;

    nvrtc_program prog = NULL;
    nvrtc_result r = nv.CreateProgram(&prog, source, name ? name : "kernel.cu", 0, NULL, NULL);
    if (r != NVRTC_OK) {
        snprintf(err, errlen, "nvrtcCreateProgram: %s", nv.GetErrorString(r));
        return r == NVRTC_OUT_OF_MEMORY ? ATTNRES_ENOMEM : ATTNRES_ECOMPILE;
    }
    int status = ATTNRES_OK;
    r = nv.CompileProgram(prog, nopts, opts);
    char *text = take_log(prog);
    if (r != NVRTC_OK) {
        const char *first = text ? text : "";
        size_t flen = strcspn(first, "\n");
        snprintf(err, errlen, "NVRTC %s %s for %s%s%.*s", r == NVRTC_INVALID_OPTION ? "refused an option" : "failed",
                 nv.GetErrorString(r), gpu + 19, flen ? ": " : "", (int)(flen > 400 ? 400 : flen), first);
        status = r == NVRTC_OUT_OF_MEMORY ? ATTNRES_ENOMEM : ATTNRES_ECOMPILE;
        goto done;
    }
    if (res && want_cubin)
        ar_nvrtc_parse_module_resources(text, res);
    if (blob) {
        size_t n = 0;
        r = want_cubin ? nv.GetCUBINSize(prog, &n) : nv.GetPTXSize(prog, &n);
        if (r != NVRTC_OK || n == 0) {
            snprintf(err, errlen, "NVRTC produced no %s: %s", want_cubin ? "cubin" : "PTX", nv.GetErrorString(r));
            status = ATTNRES_ECOMPILE;
            goto done;
        }
        char *out = malloc(n + 1);
        if (!out) {
            snprintf(err, errlen, "out of memory (%zu bytes)", n);
            status = ATTNRES_ENOMEM;
            goto done;
        }
        r = want_cubin ? nv.GetCUBIN(prog, out) : nv.GetPTX(prog, out);
        if (r != NVRTC_OK) {
            free(out);
            snprintf(err, errlen, "NVRTC could not return the %s: %s", want_cubin ? "cubin" : "PTX",
                     nv.GetErrorString(r));
            status = ATTNRES_ECOMPILE;
            goto done;
        }
        out[n] = 0; /* PTX is text: keep it terminated even if NVRTC did not count the NUL */
        *blob = out;
        if (size)
            *size = n;
    }
done:
    if (log)
        *log = text;
    else
        free(text);
    nv.DestroyProgram(&prog);
    return status;
}
