/*
 * device.h - the device abstraction inside the runtime (not public).
 *
 * A device is a table of operations plus its state, in the manner of
 * ggml-backend: the CPU backend is a real device with the same table as
 * CUDA. The tuner uses the same operations to allocate, copy and time.
 */
#ifndef AR_DEVICE_H
#define AR_DEVICE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "attnres.h"

/* A loaded kernel, ready to launch. */
typedef struct ar_kernel {
    void *module;     /* dlopen handle or CUmodule; NULL for built-ins */
    void *entry;      /* function pointer or CUfunction */
    int32_t threads;  /* CPU: most workers; CUDA: threads per block */
    int32_t tokens_per_block; /* CUDA: tokens one block handles */
    int32_t smem;     /* CUDA: dynamic shared memory bytes */
    char variant[128];
    char kernel_name[160];
    char build_key[65];
} ar_kernel;

/* The arguments of one operation, tagged with the op they belong to, so
 * that one launch slot and one timing slot serve every op (in the manner of
 * ggml's op-generic compute). */
typedef struct ar_op_args {
    attnres_op op;
    union {
        const attnres_mix_args *mix;
        const attnres_phase1_args *phase1;
        const attnres_phase2_args *phase2;
        const attnres_mix_backward_args *mix_backward;
        const attnres_phase1_backward_args *phase1_backward;
        const attnres_phase2_backward_args *phase2_backward;
    };
} ar_op_args;

static inline ar_op_args ar_op_mix(const attnres_mix_args *a)
{
    return (ar_op_args){.op = ATTNRES_OP_MIX, .mix = a};
}

static inline ar_op_args ar_op_phase1(const attnres_phase1_args *a)
{
    return (ar_op_args){.op = ATTNRES_OP_PHASE1, .phase1 = a};
}

static inline ar_op_args ar_op_phase2(const attnres_phase2_args *a)
{
    return (ar_op_args){.op = ATTNRES_OP_PHASE2, .phase2 = a};
}

static inline ar_op_args ar_op_mix_backward(const attnres_mix_backward_args *a)
{
    return (ar_op_args){.op = ATTNRES_OP_MIX_BACKWARD, .mix_backward = a};
}
static inline ar_op_args ar_op_phase1_backward(const attnres_phase1_backward_args *a)
{
    return (ar_op_args){.op = ATTNRES_OP_PHASE1_BACKWARD, .phase1_backward = a};
}
static inline ar_op_args ar_op_phase2_backward(const attnres_phase2_backward_args *a)
{
    return (ar_op_args){.op = ATTNRES_OP_PHASE2_BACKWARD, .phase2_backward = a};
}

/* The ops a kernel's ABI tag may name (attnres_op values 0 to AR_OPS - 1). */
#define AR_OPS 6

/* An op's name as problems files, the database and messages spell it
 * ("mix", "phase1_backward", ...); "unknown" for a value out of range. */
const char *ar_op_name(attnres_op op);

/* The forward op whose problem fields a backward op shares (the op
 * itself for a forward op): its S, fuse_add, form and epilogue rules. */
static inline attnres_op ar_op_forward(attnres_op op)
{
    return op == ATTNRES_OP_MIX_BACKWARD      ? ATTNRES_OP_MIX
           : op == ATTNRES_OP_PHASE1_BACKWARD ? ATTNRES_OP_PHASE1
           : op == ATTNRES_OP_PHASE2_BACKWARD ? ATTNRES_OP_PHASE2
                                              : op;
}

/* Tokens per group of the mix backward's per-group gradient sums: fixed
 * for every kernel and thread count, so that the sums over tokens are the
 * same whatever runs them (attnres.h, "Training"). 32 tokens keep the
 * workspace at d / 8 bytes per token, and a group is work enough to spread. */
#define AR_GRAD_GROUP 32

/* The mix backward's workspace for T tokens, in groups of AR_GRAD_GROUP:
 * the groups' rows of d fp32 sums of du at offset 0; with the output-norm
 * epilogue, the groups' rows of d fp32 sums of d(out_gain) from
 * dgout_offset; then one fp32 sum of d(alpha) per group from
 * alpha_offset. Offsets are 64-byte aligned. */
typedef struct ar_backward_ws {
    size_t bytes, dgout_offset, alpha_offset;
} ar_backward_ws;

/* Fills *ws for d, T and whether the problem has the epilogue: 0, or -1
 * when the workspace does not fit size_t. */
static inline int ar_mix_backward_workspace(int64_t d, int64_t T, int epilogue, ar_backward_ws *ws)
{
    const uint64_t groups = T <= 0 ? 0 : ((uint64_t)T + AR_GRAD_GROUP - 1) / AR_GRAD_GROUP;
    uint64_t rows, padded, off, all;
    if (d < 0 || __builtin_mul_overflow(groups, (uint64_t)d * 4u, &rows) || rows > (uint64_t)SIZE_MAX / 4)
        return -1;
    padded = (rows + 63) / 64 * 64;
    off = epilogue ? 2 * padded : padded;
    if (__builtin_mul_overflow(groups, 4u, &all) || __builtin_add_overflow(off, all, &all) ||
        all > (uint64_t)SIZE_MAX)
        return -1;
    ws->bytes = (size_t)all;
    ws->dgout_offset = (size_t)padded;
    ws->alpha_offset = (size_t)off;
    return 0;
}

typedef struct ar_backend ar_backend;

struct attnres_device {
    const ar_backend *ops;
    int index;
    char backend[16], name[256], arch[64], driver[128], fingerprint[640];
    int32_t units;
    int64_t memory;
    /* 1 when the device is the simulated CUDA driver's (tests/cudasim):
     * its results must never serve real hardware (DESIGN §8). */
    int simulated;
    /* Parts of the build key (DESIGN §4): who compiles, how, for what. */
    char compiler[256], options[256], target[256];
    /* Failure messages are kept per thread under this id (errmsg.h), so
     * threads sharing the device never see each other's. Read them with
     * attnres_device_errmsg(dev). */
    uint64_t err_id;
    /* Guards what a device changes after it is open: the CUDA backend's
     * binary form and `target` (switch_to_ptx), read under it by
     * ar_build_key. */
    pthread_mutex_t lock;
    void *state;          /* backend-private */
};

/* The ceilings of a device (docs/design.md §2): what streaming kernels
 * achieve, each measured as the median of repeated runs (the statistic
 * kernel times are quoted in) and as its fastest run (what the out-of-cache
 * check holds a kernel's median to). A copy point counts bytes read +
 * written, a read point bytes read. */
enum { AR_CEILING_COPY = 0, AR_CEILING_READ = 1 };
/* Every streaming kernel (seven on x86-64) on 1, 2, 4, ... and all of up to
 * 4096 threads. */
enum { AR_CEILING_POINTS = 96 };
typedef struct ar_ceiling_point {
    const char *kernel; /* static name: "memcpy", "copy-nt", "read", ... */
    int kind;           /* AR_CEILING_COPY or AR_CEILING_READ */
    int threads;        /* CPU threads; on CUDA the blocks per SM */
    double gbps;
    double best_gbps;   /* the fastest run; 0 where only gbps was measured */
} ar_ceiling_point;
typedef struct ar_ceilings {
    int n;
    ar_ceiling_point pt[AR_CEILING_POINTS];
    double fma_gflops;  /* fp32 FMA peak, 2 flop per lane (NaN: not measured) */
    int fma_threads;    /* threads that reached it */
    double cache_bytes; /* the largest cache a kernel's data can sit in (0: unknown) */
    /* On the CPU: what sysfs (or the C library) says of the largest cache,
     * and its effective size found by a read sweep (0: no knee seen);
     * cache_bytes is the sweep's where it found one, else the hint. */
    double cache_hint_bytes, cache_measured;
} ar_ceilings;

/* A pass of a device's streaming kernels that moves as many bytes as a
 * kernel does, the way its ceiling assumes (docs/design.md §2): each step
 * runs one streaming kernel, named as in ar_ceiling_point, on its thread
 * count over `bytes` at `offset` into the pass's buffer. A read step reads
 * them; a copy step reads them and writes as many right after them. The
 * tuner times a pass between a kernel's timed rounds, so that kernel and
 * ceiling share one minute of a shared machine. Each step's bytes are a
 * multiple of 4096 * threads (CPU) or of 4096 (CUDA, where threads are
 * blocks per SM, and 0 for the driver's memcpy-dtod), its offset of 64. */
enum { AR_STREAM_STEPS = 2 };
typedef struct ar_stream_step {
    const char *kernel; /* NULL: the step is unused */
    int threads;
    size_t offset, bytes;
} ar_stream_step;
typedef struct ar_stream_pass {
    ar_stream_step step[AR_STREAM_STEPS];
} ar_stream_pass;


struct ar_backend {
    const char *name;
    int (*count)(void); /* devices present; 0 when the driver is missing */
    int (*open)(attnres_device *dev, int index);
    void (*close)(attnres_device *dev);
    /* Compiles source into a loadable binary; *log gets the compiler's
     * output (malloc'ed, may be NULL). */
    int (*compile)(attnres_device *dev, const char *source,
                   const char *kernel_name, void **blob, size_t *size,
                   char **log);
    /* Loads a binary that compile produced. source, when not NULL, is what
     * it was compiled from: a backend whose driver refuses the binary for
     * this device (CUDA: a cubin without code for it) recompiles the source
     * in a form the driver accepts and loads that instead. */
    int (*load)(attnres_device *dev, const void *blob, size_t size,
                const char *source, const char *kernel_name,
                const char *params_json, ar_kernel *k);
    /* Refuses, with EINVAL and a message naming the limit, a problem that
     * attnres_problem_check accepts but no kernel of the device can run,
     * so that a plan is never made for it. NULL: every problem runs. */
    int (*check_problem)(attnres_device *dev, const attnres_problem *p);
    /* Loads the built-in generic kernel of the problem's op and dtype. */
    int (*load_generic)(attnres_device *dev, const attnres_problem *p, ar_kernel *k);
    void (*unload)(attnres_device *dev, ar_kernel *k);
    /* Runs one operation of any kind: the backend switches on a->op, which
     * must equal the problem's op (EINVAL otherwise). Asynchronous on
     * `stream` where the device has streams. */
    int (*launch)(attnres_device *dev, const ar_kernel *k,
                  const attnres_problem *p, int64_t T,
                  const ar_op_args *a, void *stream);
    /* Memory and timing, for the tuner and tests. */
    int (*mem_alloc)(attnres_device *dev, size_t bytes, void **ptr);
    void (*mem_free)(attnres_device *dev, void *ptr);
    int (*copy_to_device)(attnres_device *dev, void *dst, const void *src,
                          size_t bytes);
    int (*copy_to_host)(attnres_device *dev, void *dst, const void *src,
                        size_t bytes);
    /* Times `reps` launches of any operation one by one, flushing caches
     * between them when flush is set (where the device has a cache it can
     * flush); writes microseconds per launch to times_us. */
    int (*time)(attnres_device *dev, const ar_kernel *k,
                const attnres_problem *p, int64_t T, const ar_op_args *a,
                int reps, int flush, double *times_us);
    /* Device copy bandwidth in GB/s (bytes read + written per second) and the
     * time of an empty launch in microseconds. */
    int (*copy_bandwidth)(attnres_device *dev, double *gbps);
    /* Read-only bandwidth in GB/s: the ceiling of a kernel that mostly
     * reads, which on a CPU can sit well below the copy figure (NT stores
     * cost a core no load concurrency). NULL where not measured. */
    int (*read_bandwidth)(attnres_device *dev, double *gbps);
    int (*empty_launch)(attnres_device *dev, double *us);
    /* Every streaming kernel the backend has, each at each thread count
     * (or launch shape) it tries, and the arithmetic peak: the ceilings a
     * kernel's timing is compared with (docs/design.md §2). NULL where the
     * backend has none; then copy_bandwidth and read_bandwidth stand in. */
    int (*ceilings)(attnres_device *dev, ar_ceilings *out);
    /* Runs one pass of streaming kernels over device memory buf (which
     * holds every step's bytes) and writes its time in microseconds to us.
     * NULL where the backend has none. */
    int (*stream_pass)(attnres_device *dev, void *buf, const ar_stream_pass *pass, double *us);
};

extern const ar_backend ar_cpu_backend;
extern const ar_backend ar_cuda_backend;

/* Records a formatted message for the calling thread on the device and
 * returns status. The arguments may include attnres_device_errmsg(dev). */
int ar_device_fail(attnres_device *dev, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fills *out for a backward's workspace (ar_mix_backward_workspace, rows
 * of `row` floats) and checks that the caller's, ws of size bytes, holds
 * it: ATTNRES_OK, or EINVAL saying how much T needs. T = 0 needs none. */
int ar_backward_workspace_fits(attnres_device *dev, int64_t row, int64_t T, int epilogue, const void *ws,
                               size_t size, ar_backward_ws *out);

/* Softmax over the n sources of each head, in place on scores laid out
 * [n][heads], for the fp64 references (reference.c). Writes the log-sum-exp
 * per head when lse is not NULL. */
void ar_softmax_heads(double *s, int n, int heads, double *lse);

/* The logistic function, without overflow for large |x|; NaN stays NaN. */
double ar_sigmoid(double x);

/* Starts a public call that returns a handle through out: points a NULL
 * msg at scratch, so that every failure can write its message, and fails
 * with ATTNRES_EINVAL (said in msg) when out is NULL. */
int ar_handle_call_start(const void *out, char **msg, size_t *msg_len, char *scratch, size_t scratch_len);

/* Whether a kernel that declares ABI version `abi` for op `op` (an
 * attnres_op; -1 when it declares none) suits this library, whose versions
 * by op are versions[AR_OPS] (AR_CPU_ABI_VERSIONS, AR_CUDA_ABI_VERSIONS). A
 * kernel without an op tag predates per-op versions, when version 1 named
 * every struct: it suits only while every op is still at 1. On refusal,
 * why says so. */
int ar_kernel_abi_ok(const int versions[AR_OPS], int64_t abi, int64_t op, char *why, size_t why_len);

/* Where a caller-allocated struct's fields end in the oldest layout this
 * library takes, that of 0.2.0 (when struct_size came in). A caller built
 * against an older attnres.h of 0.2 or later passes a struct_size from
 * there up to sizeof; the fields past its end take their defaults. */
#define AR_SIZE_THROUGH(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))
#define AR_PROBLEM_SIZE_0_2 AR_SIZE_THROUGH(attnres_problem, fuse_add)
#define AR_MIX_ARGS_SIZE_0_2 AR_SIZE_THROUGH(attnres_mix_args, normed_stride)
#define AR_PHASE1_ARGS_SIZE_0_2 AR_SIZE_THROUGH(attnres_phase1_args, lse_stride)
#define AR_PHASE2_ARGS_SIZE_0_2 AR_SIZE_THROUGH(attnres_phase2_args, normed_stride)
#define AR_DEVICE_INFO_SIZE_0_2 AR_SIZE_THROUGH(attnres_device_info, simulated)

/* 0 when a caller-allocated struct's struct_size (got) lies between the
 * oldest size this library takes and its own (want); else 1 with a message
 * naming the type, the sizes and the function (init) that fills the
 * struct. */
int ar_struct_size_check(size_t got, size_t oldest, size_t want, const char *type, const char *init, char *msg,
                         size_t msg_len);

/* Takes a caller's struct (src, whose struct_size has passed
 * ar_struct_size_check) into dst, a struct of this library's size that
 * holds the defaults: the caller's bytes replace dst's first ones, so the
 * fields an older caller lacks keep their defaults, and dst's struct_size
 * becomes this library's. */
void ar_struct_adopt(const void *src, void *dst, size_t want);

/* A caller's problem as this library's struct (fields it lacks are 0, as
 * attnres_problem_init leaves them): ATTNRES_OK, or EINVAL with a message
 * for NULL or a struct_size out of range. Public functions that take a
 * problem read it through this. */
int ar_problem_adopt(const attnres_problem *p, attnres_problem *out, char *msg, size_t msg_len);

/* Reads "key":integer from a flat JSON object; returns fallback if absent. */
int64_t ar_json_int(const char *json, const char *key, int64_t fallback);
/* Reads "key":number (the first such key in the text); fallback where it is
 * absent or not a number (null). */
double ar_json_double(const char *json, const char *key, double fallback);

/* The build key of a source on a device: sha256 of source hash, compiler,
 * options and target. */
void ar_build_key(const attnres_device *dev, const char *source_hash,
                  char key[65]);

#endif
