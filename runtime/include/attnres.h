/*
 * attnres.h - the one public header of libattnres.
 *
 * libattnres computes Attention Residuals depth aggregation ("RMSNorm + depth
 * softmax") with kernels tuned per device and recorded in an SQLite database.
 * An inference engine opens a device and a database at model load, plans
 * every routing site once, and on the hot path only calls attnres_run_mix().
 *
 * Conventions
 *   - Every function that can fail returns an int status: ATTNRES_OK (0) or
 *     one of the attnres_status codes below. Codes are never renumbered.
 *   - Handles are opaque. Each *_open/_create has a *_close/_destroy; passing
 *     NULL to a destructor is a harmless no-op.
 *   - Each handle keeps the message of its last failure (attnres_*_errmsg).
 *     Functions that create a handle take a caller buffer for the message,
 *     because on failure there is no handle to hold it.
 *   - The library never aborts, exits or prints.
 *   - Buffers (sources, queries, outputs) are owned by the caller and are
 *     only borrowed for the duration of a call.
 *   - Handles are safe to use from several threads once created, except that
 *     a handle must not be destroyed while another thread uses it.
 */
#ifndef ATTNRES_H
#define ATTNRES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNRES_VERSION_MAJOR 0
#define ATTNRES_VERSION_MINOR 1
#define ATTNRES_VERSION_PATCH 0
#define ATTNRES_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define ATTNRES_API __attribute__((visibility("default")))
#else
#define ATTNRES_API
#endif

/* Status codes. Values are stable: new codes are only ever appended. */
typedef enum attnres_status {
    ATTNRES_OK = 0,
    ATTNRES_EINVAL = 1,      /* an argument is invalid (shape, pointer, value) */
    ATTNRES_ENOMEM = 2,      /* an allocation failed */
    ATTNRES_ENODEV = 3,      /* the requested device is not present */
    ATTNRES_EDB = 4,         /* the database cannot be read or is not an attnres db */
    ATTNRES_EDBVERSION = 5,  /* the database schema is newer than this library */
    ATTNRES_ENOTFOUND = 6,   /* no tuned kernel matches and the caller required one */
    ATTNRES_ECOMPILE = 7,    /* compiling a kernel failed */
    ATTNRES_ELOAD = 8,       /* loading a compiled kernel failed */
    ATTNRES_ELAUNCH = 9,     /* launching a kernel failed */
    ATTNRES_EUNSUPPORTED = 10, /* the device or build does not support this */
    ATTNRES_EIO = 11,        /* a file could not be read or written */
    ATTNRES_EMISMATCH = 12   /* run arguments do not match the plan */
} attnres_status;

/* Returns a static English description of any status code (never NULL). */
ATTNRES_API const char *attnres_errstr(int status);

/* Returns ATTNRES_VERSION_STRING of the library actually linked. */
ATTNRES_API const char *attnres_version(void);

/* ------------------------------------------------------------------------
 * Problem description
 * ---------------------------------------------------------------------- */

typedef enum attnres_dtype {
    ATTNRES_DTYPE_F32 = 0,
    ATTNRES_DTYPE_BF16 = 1,
    ATTNRES_DTYPE_F16 = 2
} attnres_dtype;

typedef enum attnres_op {
    ATTNRES_OP_MIX = 0,
    ATTNRES_OP_PHASE1 = 1,
    ATTNRES_OP_PHASE2 = 2
} attnres_op;

typedef enum attnres_form {
    ATTNRES_FORM_REPLACE = 0,  /* out = mix */
    ATTNRES_FORM_ADDITIVE = 1  /* out = partial + alpha * mix (Delta AttnRes) */
} attnres_form;

/* The shape of one routing site. T is not part of it: a plan covers all T. */
typedef struct attnres_problem {
    attnres_op op;
    attnres_dtype dtype;   /* storage type of sources, partial, out and normed */
    int64_t d;             /* row width */
    int32_t n;             /* number of sources, >= 1 */
    int32_t heads;         /* H, divides d; 1 is the original AttnRes */
    attnres_form form;
    int32_t epilogue;      /* 1: also write normed = out * rms(out)^-1 * out_gain */
} attnres_problem;

/* Fills p with a replace-form, single-head, no-epilogue mix problem. */
ATTNRES_API void attnres_problem_init(attnres_problem *p, attnres_dtype dtype,
                                      int64_t d, int32_t n);

/* Checks a problem; on failure writes a message naming the problem to msg. */
ATTNRES_API int attnres_problem_check(const attnres_problem *p, char *msg,
                                      size_t msg_len);

/* Size in bytes of one element of a storage type, 0 for an unknown type. */
ATTNRES_API size_t attnres_dtype_size(attnres_dtype dtype);

/* Short names "f32", "bf16", "f16" and back; parse returns EINVAL if unknown. */
ATTNRES_API const char *attnres_dtype_name(attnres_dtype dtype);
ATTNRES_API int attnres_dtype_parse(const char *name, attnres_dtype *out);

/* ------------------------------------------------------------------------
 * Devices
 * ---------------------------------------------------------------------- */

typedef struct attnres_device attnres_device;

/* Opens a device by spec: "cpu", "cuda" (= "cuda:0") or "cuda:N".
 * On success *out is a new handle owned by the caller (attnres_device_close).
 * On failure *out is NULL and msg (if not NULL) holds the reason. */
ATTNRES_API int attnres_device_open(const char *spec, attnres_device **out,
                                    char *msg, size_t msg_len);

/* Releases the device. NULL is a no-op. Plans made on it must be destroyed
 * first. */
ATTNRES_API void attnres_device_close(attnres_device *dev);

/* Number of devices of a backend ("cpu" or "cuda") present on this host. */
ATTNRES_API int attnres_device_count(const char *backend);

/* The device fingerprint fields (DESIGN §4). Strings are owned by the
 * device handle and live as long as it does. */
typedef struct attnres_device_info {
    const char *backend;  /* "cpu" or "cuda" */
    const char *name;     /* marketing name, e.g. "NVIDIA H200" */
    const char *arch;     /* "sm_90", or the CPU ISA such as "x86_64-avx512" */
    int32_t units;        /* SMs or CPU cores */
    int64_t memory;       /* bytes */
    const char *driver;   /* driver version, or the OS kernel release */
    const char *fingerprint; /* all of the above joined; the database key */
} attnres_device_info;

ATTNRES_API int attnres_device_info_get(attnres_device *dev,
                                        attnres_device_info *info);

/* The message of the last failure on this device (never NULL). */
ATTNRES_API const char *attnres_device_errmsg(attnres_device *dev);

/* ------------------------------------------------------------------------
 * Tuning database (read-only from the runtime)
 * ---------------------------------------------------------------------- */

typedef struct attnres_db attnres_db;

/* Opens a tuning database read-only. A missing file, a file that is not an
 * attnres database, or one with a newer schema is refused with EDB or
 * EDBVERSION and a message. *out is owned by the caller (attnres_db_close). */
ATTNRES_API int attnres_db_open(const char *path, attnres_db **out, char *msg,
                                size_t msg_len);

/* Closes the database. NULL is a no-op. Plans do not keep the database
 * open: it may be closed as soon as planning is done. */
ATTNRES_API void attnres_db_close(attnres_db *db);

/* ------------------------------------------------------------------------
 * Plans: made at model load, run on the hot path
 * ---------------------------------------------------------------------- */

typedef struct attnres_plan attnres_plan;

/* Where the kernels of a plan came from (DESIGN §4 fallback chain). */
typedef enum attnres_plan_level {
    ATTNRES_LEVEL_EXACT = 0,         /* tuned on this very device */
    ATTNRES_LEVEL_ARCHITECTURE = 1,  /* tuned on a device of the same arch */
    ATTNRES_LEVEL_BACKEND = 2,       /* tuned on another device of the backend */
    ATTNRES_LEVEL_GENERIC = 3        /* the built-in generic kernel */
} attnres_plan_level;

/* Flags for attnres_plan_create. */
#define ATTNRES_PLAN_REQUIRE_EXACT 1u /* fail with ENOTFOUND rather than fall back */

/* Plans a problem on a device. db may be NULL (generic kernels only).
 * Everything a run needs (every T bucket's kernel) is loaded here, so that
 * attnres_run_mix does no allocation, lookup or compilation.
 * On success *out is owned by the caller (attnres_plan_destroy); on failure it
 * is NULL and the message is in msg and in attnres_device_errmsg(dev). */
ATTNRES_API int attnres_plan_create(attnres_device *dev, attnres_db *db,
                                    const attnres_problem *problem,
                                    unsigned flags, attnres_plan **out,
                                    char *msg, size_t msg_len);

/* Destroys a plan. NULL is a no-op. */
ATTNRES_API void attnres_plan_destroy(attnres_plan *plan);

/* The fallback level the plan used (lowest over its T buckets). */
ATTNRES_API attnres_plan_level attnres_plan_level_get(const attnres_plan *plan);

/* Writes a human-readable explanation of the plan: the level, why, and each
 * T bucket's kernel. Returns the length it needed (like snprintf). */
ATTNRES_API size_t attnres_plan_explain(const attnres_plan *plan, char *buf,
                                        size_t buf_len);

/* The message of the last failure on this plan (never NULL). */
ATTNRES_API const char *attnres_plan_errmsg(const attnres_plan *plan);

/* Arguments of one mix launch. Pointers are device pointers for the plan's
 * device (host pointers on the CPU). Strides count elements, not bytes. */
typedef struct attnres_mix_args {
    const void *const *sources;   /* n pointers, each a [T, d] view */
    const int64_t *source_strides;/* n token strides; NULL means all d */
    const float *query;           /* [d] fp32 u = gain * w (see fold_query) */
    float scale;                  /* score scale, usually 1 */
    float eps;                    /* RMS epsilon, > 0 */
    const void *partial;          /* [T, d], additive form only */
    int64_t partial_stride;       /* 0 means d */
    float alpha;                  /* additive form: out = partial + alpha*mix */
    void *out;                    /* [T, d] */
    int64_t out_stride;           /* 0 means d */
    const float *out_gain;        /* [d] fp32, epilogue only */
    float out_eps;                /* epilogue epsilon, > 0 */
    void *normed;                 /* [T, d], epilogue only */
    int64_t normed_stride;        /* 0 means d */
} attnres_mix_args;

/* Fills args with defaults: scale 1, eps 1e-6, alpha 1, out_eps 1e-6, all
 * pointers NULL and strides 0. */
ATTNRES_API void attnres_mix_args_init(attnres_mix_args *args);

/* Folds the RMSNorm gain into the pseudo-query: u[k] = gain[k] * w[k].
 * gain may be NULL (all ones). Do this once at model load. */
ATTNRES_API void attnres_fold_query(const float *w, const float *gain,
                                    float *u, int64_t d);

/* Runs the plan on T tokens. stream is a CUstream for CUDA plans (NULL for
 * the default stream) and ignored on the CPU. T = 0 is a successful no-op.
 * Checks that the arguments match the plan (EINVAL/EMISMATCH otherwise) but
 * never allocates, reads the database or compiles. On CUDA the launch is
 * asynchronous and safe to capture in a graph. */
ATTNRES_API int attnres_run_mix(attnres_plan *plan, int64_t T,
                                const attnres_mix_args *args, void *stream);

/* ------------------------------------------------------------------------
 * fp64 reference (DESIGN §1), the oracle for tests and tuner verification
 * ---------------------------------------------------------------------- */

/* Computes the mix operation in double precision on host memory.
 * sources: n pointers to [T, d] doubles (token stride d); query: [d] (already
 * folded); partial: [T, d] or NULL; out: [T, d]; out_gain/normed may be NULL
 * when epilogue is 0. Returns EINVAL with no output written for a bad shape. */
ATTNRES_API int attnres_reference_mix(const attnres_problem *problem, int64_t T,
                                      const double *const *sources,
                                      const double *query, double scale,
                                      double eps, const double *partial,
                                      double alpha, const double *out_gain,
                                      double out_eps, double *out,
                                      double *normed);

#ifdef __cplusplus
}
#endif
#endif /* ATTNRES_H */
