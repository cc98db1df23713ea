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
 *   - Failure messages are kept per handle AND per thread, like errno:
 *     attnres_device_errmsg(dev) and attnres_plan_errmsg(plan) return the
 *     message of the calling thread's last failed call on that handle ("" if
 *     it has none), whatever other threads do on the same handle meanwhile.
 *     The string stays valid until the same thread's next failure. A
 *     successful call leaves the message as it was; so read it right after
 *     the failure, in the thread that failed. Each thread remembers its last
 *     few (4) handles. Functions that create a handle take a caller buffer
 *     for the message, because on failure there is no handle to hold it.
 *   - The library never aborts, exits or prints.
 *   - Buffers (sources, queries, outputs) are owned by the caller and are
 *     only borrowed for the duration of a call.
 *   - NULL, in one place for every function. A NULL pointer never
 *     crashes the library: a function that returns a status returns
 *     EINVAL (with a message where it has a buffer or handle for one)
 *     when a pointer it needs is NULL; a void function given a NULL struct
 *     or buffer does nothing; destructors, *_errmsg, attnres_plan_level_get
 *     and attnres_plan_explain accept a NULL handle. Needed, so never
 *     NULL: the handle a call works on (dev, plan), every out parameter
 *     (out of *_open, *_create and attnres_dtype_parse), the problem, a
 *     run's args, and in args the buffers its problem uses: sources and
 *     each sources[i], query or queries, out, each o1[j] and lse[j], o1
 *     and lse of phase 2, partial (additive form, phase 2), sublayer
 *     (fuse_add), out_gain and normed (epilogue); the same for the fp64
 *     references. May be NULL: msg (msg_len is then ignored),
 *     source_strides (every stride d), attnres_plan_create's db (built-in
 *     kernels only), attnres_fold_query's gain (all ones), the path of
 *     attnres_miss_file_set (recording off), the buffers a problem
 *     does not use, and in the backward references the incoming
 *     gradients (zero) and the parameter gradients they name as optional.
 *   - Views and aliasing. A run's [T, w] argument with token stride s
 *     (elements) spans (T - 1) * s + w elements from its pointer; every
 *     such extent, in elements and in bytes (at most PTRDIFF_MAX), its
 *     last address, and s in bytes (even for T = 1) must be
 *     representable, else the run fails with EINVAL naming the argument
 *     and its stride, before anything is read or written. An output (mix: out, normed; phase1: every o1[j] and
 *     lse[j]; phase2: out, normed, and partial with fuse_add) must share
 *     no byte with any other argument, input or output, with one
 *     exception: mix's out may be exactly partial (same pointer and
 *     stride), which updates the partial sum in place. Inputs may share
 *     memory with each other. Overlap is judged by the bytes each view's
 *     rows cover where two views have the same stride (so the interleaved
 *     halves of a [T, 2d] buffer are distinct views), else by the whole
 *     range [pointer, pointer + extent); with more than 64 phase-1 sites,
 *     by whole ranges among the o1 and lse views. A run that breaks these
 *     rules fails with EINVAL naming both arguments, and writes nothing.
 *   - Handles are safe to use from several threads once created: any number
 *     of threads may plan on one device and run one plan at the same time
 *     (each with its own buffers). A handle must not be destroyed while
 *     another thread uses it, and a device must outlive its plans. On a
 *     "cpu" device runs are serialised: its worker threads take one launch
 *     at a time, so a run from a second thread waits until the first ends
 *     rather than sharing the cores with it.
 *   - Structs the caller allocates and the library reads or fills
 *     (attnres_problem, attnres_mix_args, attnres_phase1_args,
 *     attnres_phase2_args, attnres_device_info) start with `struct_size`,
 *     which must be sizeof the struct as the caller compiled it. The *_init
 *     functions set it; attnres_device_info needs it set by hand
 *     (`attnres_device_info info = {.struct_size = sizeof info};`). New
 *     fields are only ever appended, so a program built against an older
 *     attnres.h (0.2.0 or later) keeps working with a newer library: its
 *     smaller struct is taken, no byte past its struct_size is read or
 *     written, and the fields it lacks take the defaults its *_init would
 *     give them. A size from before 0.2.0, or larger than this library's
 *     (a newer header), is refused with ATTNRES_EINVAL and a message naming
 *     the sizes, so that such a program fails clearly instead of reading
 *     past its struct.
 *
 * Environment, files and processes
 *   The library reads these environment variables (each when first needed,
 *   named again where it matters below):
 *     ATTNRES_CACHE_DIR  directory of the binary cache (default below);
 *     XDG_CACHE_HOME, HOME  the default cache directory:
 *                        $XDG_CACHE_HOME/attnres, else $HOME/.cache/attnres,
 *                        else (or if that cannot be created)
 *                        /tmp/attnres-cache-UID;
 *     ATTNRES_CC         the C compiler for CPU kernels (default "cc", found
 *                        on PATH);
 *     TMPDIR             where the C compiler works (default /tmp);
 *     PATH               where ATTNRES_CC is looked up;
 *     ATTNRES_CUDA_DRIVER, ATTNRES_CUDA_PTX  the CUDA driver library and
 *                        the binary form (attnres_device_open);
 *     CUDA_HOME, CUDA_PATH  where libnvrtc is looked for after the loader's
 *                        path (then /usr/local/cuda);
 *     ATTNRES_CPU_BUILTIN_ISA  caps the ISA level of the CPU built-in
 *                        kernels (attnres_device_open);
 *     ATTNRES_MISS_FILE  the miss file (attnres_miss_file_set), read once;
 *     ATTNRES_CPU_CACHE_SYSFS  a directory laid out as sysfs's
 *                        /sys/devices/system/cpu/cpu0/cache, read in its
 *                        place when the tuner measures a CPU device's
 *                        ceilings (for tests: the cache sizes it says are
 *                        a hint beside a read sweep).
 *   Files it writes (never the database, which it only reads):
 *     the binary cache: one file per compiled kernel, named by its build
 *     key, written whole (temporary file + rename) by attnres_plan_create,
 *     and removed there when found damaged; a CPU kernel that cannot be
 *     cached is loaded from an anonymous memory file instead;
 *     $TMPDIR/attnres-cc-PID-XXXXXX: the C compiler's working directory
 *     during a CPU compile, removed when it ends; attnres_device_open("cpu")
 *     removes those left by killed processes;
 *     the miss file, only when one is set (ATTNRES_MISS_FILE or
 *     attnres_miss_file_set): one appended line per untuned problem and T
 *     bucket, written by the first run of a fallen-back plan in that bucket.
 *   Processes and threads it starts:
 *     attnres_device_open("cpu") starts one worker thread per further CPU
 *     core, kept until attnres_device_close;
 *     attnres_plan_create on a CPU device may run the C compiler
 *     (posix_spawnp of ATTNRES_CC, its output captured, never printed) when
 *     a tuned kernel's binary is neither cached nor in the database;
 *     attnres_plan_create on a CUDA device may compile with NVRTC (in
 *     process, no child).
 *   The hot path (attnres_run_*) reads no variable and starts nothing; it
 *     writes no file but the miss file's lines described above.
 */
#ifndef ATTNRES_H
#define ATTNRES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTNRES_VERSION_MAJOR 0
/* 0.2 added struct_size to every caller-allocated struct: not binary
 * compatible with 0.1 (the shared library's soname is libattnres.so.0.2). */
#define ATTNRES_VERSION_MINOR 2
#define ATTNRES_VERSION_PATCH 0
#define ATTNRES_VERSION_STRING "0.2.0"

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
    ATTNRES_OP_PHASE2 = 2,
    /* Appended in 0.2 for training: the backward of the mix (DESIGN §1b),
     * planned and tuned as an op of its own; see attnres_run_mix_backward. */
    ATTNRES_OP_MIX_BACKWARD = 3,
    /* The backwards of Block AttnRes' two phases (attnres_run_phase1_backward,
     * attnres_run_phase2_backward); their problems are the forward phases'. */
    ATTNRES_OP_PHASE1_BACKWARD = 4,
    ATTNRES_OP_PHASE2_BACKWARD = 5
} attnres_op;

typedef enum attnres_form {
    ATTNRES_FORM_REPLACE = 0,  /* out = mix */
    ATTNRES_FORM_ADDITIVE = 1  /* out = partial + alpha * mix (Delta AttnRes) */
} attnres_form;

/* The shape of one routing site. T is not part of it: a plan covers all T. */
typedef struct attnres_problem {
    size_t struct_size;    /* sizeof(attnres_problem); attnres_problem_init sets it */
    attnres_op op;
    attnres_dtype dtype;   /* storage type of sources, partial, out and normed */
    int64_t d;             /* row width */
    int32_t n;             /* number of sources, >= 1 */
    int32_t heads;         /* H, divides d; 1 is the original AttnRes */
    attnres_form form;
    int32_t epilogue;      /* 1: also write normed = out * rms(out)^-1 * out_gain */
    /* Appended in 0.1 for the Block AttnRes two-phase form; attnres_problem_init
     * sets both to 0, which is what every op but the named one requires. */
    int32_t s;             /* phase1: S, the routing sites (pseudo-queries) of
                            * the block, >= 1; must be 0 for mix and phase2 */
    int32_t fuse_add;      /* phase2: 1 = first add the sublayer output into the
                            * partial sum (b += f, written back); else 0 */
} attnres_problem;

/* The limits of a problem on every device: attnres_problem_check refuses
 * beyond them, the miss file records nothing beyond them, and `attnres
 * tune` reads nothing beyond them (problems files, --from-misses). They lie
 * far above every model but keep every size inside 64 bits. A device may
 * take less: attnres_plan_create refuses with EINVAL, and a message naming
 * the limit, a problem that no kernel of the device can run. The CPU takes
 *   N <= 256 sources (mix, phase1), n * S * H <= 32768 (phase1), and
 *   per-token state that its kernels keep on the stack of the thread that
 *   runs them (the caller's, and the device's workers, which it starts
 *   with stacks of at least 8 MiB) of at most ATTNRES_CPU_STACK_MAX bytes:
 *   16 d + 8 N H + 16 H + 192 N bytes (mix; phase2 with N = 1),
 *   4 (N S H + 4 H + d) + 16 N bytes (phase1),
 *   8 d + 16 N H + 8 N + 256 bytes (mix_backward; 8 d more with the
 *   epilogue), 16 N S H + 8 N + 3264 S + 256 bytes (phase1_backward,
 *   which takes S <= 64), 16 H + 256 bytes (phase2_backward; 8 d more
 *   with the epilogue).
 * For example a mix of d = H = 65536 with N = 2 fits (3 MiB), one of
 * d = 262144 does not. CUDA takes N <= 64 (mix, phase1), S <= 64 and
 * 4 (N S H + N H + N) <= 49152 bytes of shared memory (phase1), and
 * H <= 1024 (phase2). */
#define ATTNRES_MAX_D (1 << 24)     /* row width d */
#define ATTNRES_MAX_N (1 << 20)     /* sources N */
#define ATTNRES_MAX_HEADS (1 << 20) /* heads H */
#define ATTNRES_MAX_S 4096          /* phase1: sites S of a block */
#define ATTNRES_CPU_STACK_MAX (4 << 20) /* bytes */

/* Fills p with a replace-form, single-head, no-epilogue mix problem, and
 * its struct_size. */
ATTNRES_API void attnres_problem_init(attnres_problem *p, attnres_dtype dtype,
                                      int64_t d, int32_t n);

/* Checks a problem (struct_size included); on failure writes a message
 * naming the problem to msg. */
ATTNRES_API int attnres_problem_check(const attnres_problem *p, char *msg,
                                      size_t msg_len);

/* Size in bytes of one element of a storage type, 0 for an unknown type. */
ATTNRES_API size_t attnres_dtype_size(attnres_dtype dtype);

/* Short names "f32", "bf16", "f16" and back; parse returns EINVAL if the
 * name is unknown or out is NULL. */
ATTNRES_API const char *attnres_dtype_name(attnres_dtype dtype);
ATTNRES_API int attnres_dtype_parse(const char *name, attnres_dtype *out);

/* ------------------------------------------------------------------------
 * Devices
 * ---------------------------------------------------------------------- */

typedef struct attnres_device attnres_device;

/* Opens a device by spec: "cpu", "cuda" (= "cuda:0") or "cuda:N".
 * On success *out is a new handle owned by the caller (attnres_device_close).
 * On failure *out is NULL and msg (if not NULL) holds the reason.
 *
 * CUDA devices are reached through the Driver API, loaded with dlopen at the
 * first use, and NVRTC. Two environment variables, read then, shape them:
 *   ATTNRES_CUDA_DRIVER=PATH  the driver library to load instead of
 *                             libcuda.so.1: a driver outside the loader's
 *                             path, or the PTX simulator of the tests
 *                             (libattnres-cudasim.so), whose devices are
 *                             marked simulated (attnres_device_info).
 *   ATTNRES_CUDA_PTX=1        kernels are compiled to PTX, which the driver
 *                             JITs for its GPU, instead of cubins. PTX is
 *                             also used without asking when NVRTC does not
 *                             know the GPU's architecture, when the driver
 *                             refuses a cubin (CUDA_ERROR_NO_BINARY_FOR_GPU;
 *                             the kernel is recompiled and the device takes
 *                             PTX from then on) and with the simulator. The
 *                             build key's target names the form ("sm_90" or
 *                             "compute_90 (PTX for sm_90)"), so cached
 *                             binaries of the two never mix.
 *   ATTNRES_CUDA_PTX=0        cubins are offered first even to the
 *                             simulator, which refuses them, so the
 *                             recompile-as-PTX path runs (for tests).
 *
 * The CPU device's built-in kernels (the last fallback level) are compiled
 * into the library once per ISA level (x86-64: avx512, avx2, sse2;
 * AArch64: neon); the device takes the widest its CPU supports when it
 * opens, and a plan the widest whose loop step divides the head width (the
 * scalar generic kernel fits any). ATTNRES_CPU_BUILTIN_ISA=avx512, avx2,
 * sse2, neon or scalar caps that level (scalar: the scalar generic kernels
 * only); another value makes the open fail with EINVAL.
 *
 * NVRTC (libnvrtc.so.13, .12 or libnvrtc.so) is loaded from the loader's
 * path, else from $CUDA_HOME/lib64, $CUDA_PATH/lib64, /usr/local/cuda/lib64.
 * "cpu" starts the worker threads and sweeps $TMPDIR as described at the
 * top, and reads ATTNRES_CC (the compiler whose identity enters the build
 * key). */
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
    size_t struct_size;   /* set by the caller: sizeof(attnres_device_info) */
    const char *backend;  /* "cpu" or "cuda" */
    const char *name;     /* marketing name, e.g. "NVIDIA H200" */
    const char *arch;     /* "sm_90", or the CPU ISA such as "x86_64-avx512" */
    int32_t units;        /* SMs or CPU cores */
    int64_t memory;       /* bytes */
    const char *driver;   /* driver version, or the OS kernel release */
    const char *fingerprint; /* all of the above joined; the database key */
    int simulated;        /* 1: a simulated device (the CUDA driver library,
                           * chosen with ATTNRES_CUDA_DRIVER, is the PTX
                           * simulator of the tests, which exports
                           * cudasimDescribe). Its fingerprint ends in
                           * "|simulated", so its tuning results never
                           * serve a real device. 0 for real hardware. */
} attnres_device_info;

/* Fills *info, whose struct_size the caller has set (EINVAL otherwise). */
ATTNRES_API int attnres_device_info_get(attnres_device *dev,
                                        attnres_device_info *info);

/* The message of the calling thread's last failure on this device, "" if
 * none (never NULL); see Conventions. */
ATTNRES_API const char *attnres_device_errmsg(attnres_device *dev);

/* ------------------------------------------------------------------------
 * Tuning database (read-only from the runtime)
 * ---------------------------------------------------------------------- */

typedef struct attnres_db attnres_db;

/* Opens a tuning database read-only. *out is owned by the caller
 * (attnres_db_close). The file is only read, so a read-only file works,
 * and so does a file in a directory this process cannot write (a read-only
 * mount): the database is in WAL mode, whose readers need a -shm file
 * beside it, and where SQLite can neither open nor create one the file is
 * read as immutable (SQLite's immutable=1: no -shm, no locks). That is
 * right while nobody writes the file, as nobody can on a read-only mount;
 * whoever can write that directory must not tune into the file while it is
 * read that way. A -wal file there that holds changes is refused (EDB)
 * rather than read past: open the file once where it can be written.
 * Anything but a regular file (a FIFO, a device) is refused at once, as is
 * a FIFO or device in place of the -wal, -shm or -journal file: the open
 * never blocks.
 * Returns:
 *   EINVAL      path or out is NULL;
 *   ENOMEM      out of memory;
 *   EDB         a missing file, a directory, anything not a regular file,
 *               a file that is not SQLite or not an attnres database
 *               (truncated, zeroed, corrupt), or a file another process
 *               keeps locked past the busy timeout (10 s);
 *   EDBVERSION  a schema newer than this library;
 * each with a message in msg (if not NULL); *out is then NULL. Damage the
 * open does not see is reported by attnres_plan_create. */
ATTNRES_API int attnres_db_open(const char *path, attnres_db **out, char *msg,
                                size_t msg_len);

/* Closes the database. NULL is a no-op. Plans do not keep the database
 * open: it may be closed as soon as planning is done. Closing also frees
 * what the handle remembers of its lookups (see attnres_plan_create). */
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
 * is NULL and the message is in msg and in attnres_device_errmsg(dev).
 *
 * Each T bucket's binary comes from the binary cache, else the database,
 * else the compiler (from the stored source, checked against its hash).
 * Binaries carry a SHA-256 seal, checked before anything is loaded: a
 * damaged copy is passed over (and a damaged cache entry replaced). A level
 * of the fallback chain whose kernels still do not load, or whose stored
 * source does not match its hash, is skipped for the next level, and the
 * explanation says why. Returns:
 *   EINVAL       dev, problem or out is NULL, the problem is invalid, or
 *                no kernel of the device can run it (see ATTNRES_MAX_D);
 *   EUNSUPPORTED the device has no kernels for the problem's op;
 *   ENOMEM       out of memory;
 *   EDB          a database lookup failed (the file is damaged where the
 *                open did not look): no quiet fallback on a broken database;
 *   ENOTFOUND    ATTNRES_PLAN_REQUIRE_EXACT and nothing was tuned on this
 *                exact device for the problem;
 *   ELOAD, ECOMPILE, EIO, EDB
 *                ATTNRES_PLAN_REQUIRE_EXACT and the exact level's kernels
 *                neither load nor compile (EIO: no temporary files for the
 *                compiler), or their source does not match its hash.
 * None of this touches plans made before: they stay valid whatever happens
 * to the database file afterwards.
 *
 * Planning many sites of few shapes (a model load) is cheap after the first
 * plan of each shape: the database handle remembers the winners it looked
 * up (up to 64 lookups, until attnres_db_close), and plans on one device
 * that use the same tuned kernel share it, loaded once. Before it uses
 * what it remembers, each plan asks SQLite whether another connection has
 * committed to the file since (a tuner, say), and forgets all of it if so:
 * a plan always gets the winners committed before it started, as if it
 * were the handle's first. A shared kernel is unloaded with the last plan
 * that uses it, so plans stay independent: destroy them in any order.
 *
 * Side effects (see "Environment, files and processes" at the top): reads
 * and writes the binary cache under $ATTNRES_CACHE_DIR (else
 * $XDG_CACHE_HOME/attnres, $HOME/.cache/attnres or /tmp/attnres-cache-UID);
 * on a CPU device may run the C compiler ($ATTNRES_CC, default cc) in a
 * directory under $TMPDIR; on a CUDA device may compile with NVRTC. Several
 * threads may plan on one device at once; each sees its own message. */
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

/* The message of the calling thread's last failure on this plan (a run),
 * "" if none (never NULL); see Conventions. */
ATTNRES_API const char *attnres_plan_errmsg(const attnres_plan *plan);

/* Records the problems that plans fall back on (level
 * ATTNRES_LEVEL_GENERIC: nothing tuned for them in the database) in a
 * small append-only text file, for `attnres tune --from-misses PATH` to
 * tune later. Off unless this call names a file or the environment
 * variable ATTNRES_MISS_FILE=PATH does (read once, when the first plan
 * falls back; this call overrides it, and NULL or "" turns recording off).
 * The explanation of a plan that falls back names the file in force.
 *
 * The first run of each T bucket (T rounded up to a power of two) on a
 * fallen-back plan appends one line: op, dtype, d, N, H, S, form, epilogue,
 * fused add, the bucket and the device fingerprint, with a checksum
 * (runtime/src/miss_file.h has the format). Each line is one write(2) on a
 * descriptor opened with O_APPEND, so several processes may share the
 * file. A line already in the file is not written again, and nothing is
 * appended once the file holds 1 MiB. Recording never fails a plan or a
 * run, and never blocks one: a file that cannot be written loses the line,
 * silently, and a path that is not a regular file (a FIFO, /dev/stdout, a
 * directory) is opened without blocking, refused and never written; the
 * explanation of a plan made then says so. Later runs
 * of a bucket already recorded cost one atomic load. Process-wide and
 * thread-safe. Returns EINVAL for a path of 4096 bytes or more. */
ATTNRES_API int attnres_miss_file_set(const char *path);

/* Arguments of one mix launch. Pointers are device pointers for the plan's
 * device (host pointers on the CPU). Strides count elements, not bytes.
 * out and normed overlap no other argument, but out may be exactly partial
 * (see "Views and aliasing" at the top). */
typedef struct attnres_mix_args {
    size_t struct_size;           /* sizeof(attnres_mix_args); _init sets it */
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

/* Fills args with defaults: struct_size, scale 1, eps 1e-6, alpha 1,
 * out_eps 1e-6, all pointers NULL and strides 0. */
ATTNRES_API void attnres_mix_args_init(attnres_mix_args *args);

/* Folds the RMSNorm gain into the pseudo-query: u[k] = gain[k] * w[k].
 * gain may be NULL (all ones). Do this once at model load. */
ATTNRES_API void attnres_fold_query(const float *w, const float *gain,
                                    float *u, int64_t d);

/* Runs the plan on T tokens. stream is a CUstream for CUDA plans (NULL for
 * the default stream) and ignored on the CPU. T = 0 is a successful no-op.
 * Checks that the arguments match the plan (EINVAL/EMISMATCH otherwise),
 * that their extents are representable and that no output overlaps another
 * argument (EINVAL), but never allocates, reads the database or compiles. On CUDA the launch is
 * asynchronous and safe to capture in a graph. */
ATTNRES_API int attnres_run_mix(attnres_plan *plan, int64_t T,
                                const attnres_mix_args *args, void *stream);

/* ------------------------------------------------------------------------
 * Block AttnRes, two-phase form (DESIGN §1)
 *
 * For the S routing sites of one block, phase 1 mixes the n completed block
 * representations once for all S pseudo-queries; phase 2 then merges, per
 * site, that result with the block's running partial sum b:
 *
 *   phase1:  s_i,h = scale * r_i * <v_i, u_j>_h        (i < n, per site j)
 *            o1_j  = softmax_i(s_i,h) mix of v_i        (per head, as mix)
 *            lse_j = m_h + log(l_h)                     (fp32, per head)
 *   phase2:  b    += f                                  (only with fuse_add)
 *            s2_h  = scale * r_b * <b, u_j>_h
 *            p2_h  = sigmoid(s2_h - lse_j,h)
 *            out   = o1_j + p2_h * (b - o1_j)           (+ optional epilogue)
 *
 * phase1 followed by phase2 equals attnres_run_mix over the n block sources
 * plus b as source n (softmax over n + 1 sources). The first site of a block
 * has no partial sum and uses out = o1 directly.
 *
 * Problems: op ATTNRES_OP_PHASE1 needs s >= 1 (the sites) and n >= 1 (the
 * block representations); op ATTNRES_OP_PHASE2 does not read n (set it to 1)
 * and may set fuse_add and epilogue. Both use the replace form; phase1 has
 * no epilogue. Plan them with attnres_plan_create like a mix problem.
 * ---------------------------------------------------------------------- */

/* Arguments of one phase-1 launch. Pointers are device pointers for the
 * plan's device (host pointers on the CPU), borrowed for the call. Strides
 * count elements, not bytes. No output may overlap another argument (see
 * "Views and aliasing" at the top). */
typedef struct attnres_phase1_args {
    size_t struct_size;            /* sizeof(attnres_phase1_args); _init sets it */
    const void *const *sources;    /* n pointers, each a [T, d] view */
    const int64_t *source_strides; /* n token strides; NULL means all d */
    const float *queries;          /* [S, d] fp32, row j = site j's folded u */
    float scale;                   /* score scale, usually 1 */
    float eps;                     /* RMS epsilon, > 0 */
    void *const *o1;               /* S pointers, each a [T, d] output view */
    int64_t o1_stride;             /* token stride of every o1 view; 0 means d */
    float *const *lse;             /* S pointers, each a [T, H] fp32 output */
    int64_t lse_stride;            /* token stride of every lse view; 0 means H */
} attnres_phase1_args;

/* Fills args with defaults: struct_size, scale 1, eps 1e-6, pointers NULL,
 * strides 0. */
ATTNRES_API void attnres_phase1_args_init(attnres_phase1_args *args);

/* Arguments of one phase-2 launch (one site), with the same conventions:
 * out and normed overlap no other argument, nor does partial with
 * fuse_add. */
typedef struct attnres_phase2_args {
    size_t struct_size;        /* sizeof(attnres_phase2_args); _init sets it */
    const void *o1;            /* [T, d] this site's phase-1 output */
    int64_t o1_stride;         /* 0 means d */
    const float *lse;          /* [T, H] fp32, this site's phase-1 lse */
    int64_t lse_stride;        /* 0 means H */
    void *partial;             /* b [T, d]: read; written (b += f) if fuse_add */
    int64_t partial_stride;    /* 0 means d */
    const void *sublayer;      /* f [T, d], fuse_add only, else ignored */
    int64_t sublayer_stride;   /* 0 means d */
    const float *query;        /* [d] fp32, this site's folded u */
    float scale;               /* score scale, usually 1 */
    float eps;                 /* RMS epsilon, > 0 */
    void *out;                 /* [T, d] */
    int64_t out_stride;        /* 0 means d */
    const float *out_gain;     /* [d] fp32, epilogue only */
    float out_eps;             /* epilogue epsilon, > 0 */
    void *normed;              /* [T, d], epilogue only */
    int64_t normed_stride;     /* 0 means d */
} attnres_phase2_args;

/* Fills args with defaults: struct_size, scale 1, eps 1e-6, out_eps 1e-6,
 * pointers NULL, strides 0. */
ATTNRES_API void attnres_phase2_args_init(attnres_phase2_args *args);

/* Runs phase 1 of a plan made for an ATTNRES_OP_PHASE1 problem on T tokens:
 * writes o1 (storage dtype) and lse (fp32) of every site. Otherwise as
 * attnres_run_mix: T = 0 is a successful no-op; a NULL plan is EINVAL; bad
 * arguments are EINVAL or EMISMATCH (a plan of another op is EMISMATCH) with
 * the reason in attnres_plan_errmsg; a device without phase kernels gives
 * EUNSUPPORTED. Never allocates, reads the database or compiles. */
ATTNRES_API int attnres_run_phase1(attnres_plan *plan, int64_t T,
                                   const attnres_phase1_args *args,
                                   void *stream);

/* Runs phase 2 of a plan made for an ATTNRES_OP_PHASE2 problem on T tokens:
 * writes out (and normed with the epilogue); with fuse_add it first writes
 * b + f back to partial and uses that sum. Errors as attnres_run_phase1. */
ATTNRES_API int attnres_run_phase2(attnres_plan *plan, int64_t T,
                                   const attnres_phase2_args *args,
                                   void *stream);

/* ------------------------------------------------------------------------
 * Training: the backward of the mix (DESIGN §1b)
 *
 * A plan for a problem of op ATTNRES_OP_MIX_BACKWARD (the forward's d, N,
 * H and form; the same problem with op ATTNRES_OP_MIX describes the
 * forward) takes the forward's inputs and the gradient of out, recomputes
 * the RMS statistics and the softmax weights from the sources, and
 * returns the gradients of the sources, of the folded query u, and in the
 * additive form of partial and alpha. Each token's source rows are read
 * from memory once: the weights and the score gradients come from one
 * sweep over them, the source gradients from a second sweep over the same
 * rows while they are in cache.
 *
 * The gradients summed over tokens (dquery, dalpha) are deterministic:
 * tokens form groups of a fixed size that does not depend on the kernel
 * or the thread count, each group writes fp32 partial sums to the
 * caller's workspace, and a second pass adds the groups in order. The
 * same plan on the same inputs gives bit-identical gradients on every run
 * and at every thread count. No atomics are used.
 *
 * The CPU and CUDA devices run the replace and additive forms at every H,
 * from tuned winners or, without one, their built-in kernels, and the
 * output-norm epilogue's backward (a problem with epilogue = 1): from the
 * forward's out, kept by the caller, it takes the gradient of out as dout
 * plus the RMSNorm backward of dnormed, and sums the gradient of out_gain
 * over tokens as it does dquery's. A CUDA kernel keeps that gradient of
 * out, d floats, in shared memory beside its per-token tables, so CUDA
 * takes the epilogue's backward where 4 (d + 3 N H + 2 N + H) <= 49152
 * bytes (attnres_plan_create refuses a larger one with EINVAL and says
 * so).
 * ---------------------------------------------------------------------- */

/* Arguments of one mix backward launch. Pointers are host pointers on the
 * CPU. Strides count elements; 0 means d. No output may overlap an input;
 * with ATTNRES_GRAD_ACCUMULATE two source gradients may be the very same
 * view (same pointer and stride: one tensor that is two sources), and
 * both gradients are added into it.
 *
 * With ATTNRES_GRAD_DSOURCES_F32 in flags every dsources view is fp32
 * [T, d] (its stride counts floats, its pointer is 4-byte aligned) for
 * every storage dtype, written or, with ATTNRES_GRAD_ACCUMULATE, added
 * into in fp32 with no rounding to the storage dtype: a bf16 or f16 model
 * sums the gradients of a layer output that feeds many routing sites in
 * one fp32 buffer. dout, dpartial and the sources keep the storage dtype.
 * The buffers stay the caller's; the flag changes only how they are read
 * and written. With f32 storage it changes nothing. */
typedef struct attnres_mix_backward_args {
    size_t struct_size;            /* sizeof(attnres_mix_backward_args); _init sets it */
    /* The forward's inputs, as attnres_mix_args holds them. */
    const void *const *sources;    /* n pointers, each a [T, d] view */
    const int64_t *source_strides; /* n token strides; NULL means all d */
    const float *query;            /* [d] fp32 u = gain * w, as the forward used */
    float scale;                   /* score scale, usually 1 */
    float eps;                     /* RMS epsilon, > 0 */
    float alpha;                   /* additive form: out = partial + alpha * mix */
    /* The incoming gradient. */
    const void *dout;              /* [T, d] gradient of out (storage dtype) */
    int64_t dout_stride;           /* 0 means d */
    /* The gradients. */
    unsigned flags;                /* ATTNRES_GRAD_ACCUMULATE: add the per-token
                                    * gradients (dsources, dpartial) into the
                                    * caller's buffers instead of writing them;
                                    * ATTNRES_GRAD_DSOURCES_F32: dsources are fp32 */
    void *const *dsources;         /* n pointers, each a [T, d] view: storage dtype,
                                    * or fp32 with ATTNRES_GRAD_DSOURCES_F32 */
    const int64_t *dsource_strides;/* n token strides (in elements of the
                                    * dsources' type); NULL means all d */
    float *dquery;                 /* [d] fp32 gradient of u, summed over tokens,
                                    * always written (attnres_reference_fold_query_backward
                                    * turns it into those of w and the gain) */
    void *dpartial;                /* [T, d] additive form (needed there), else ignored */
    int64_t dpartial_stride;       /* 0 means d */
    float *dalpha;                 /* additive form: one float, sum over tokens of
                                    * <dout, mix>; may be NULL (alpha not trained) */
    void *workspace;               /* attnres_mix_backward_workspace_size bytes, 64-byte
                                    * aligned, owned by the caller; not read before
                                    * it is written */
    size_t workspace_size;         /* its size in bytes */
    /* The output-norm epilogue (a problem with epilogue = 1; ignored
     * otherwise), appended after 0.2.0: the forward's out, its gain and epsilon,
     * and the gradient of normed. The backward takes the gradient of out
     * as dout plus the RMSNorm backward of dnormed; dout may then be NULL
     * (the loss reads normed alone). */
    const void *out;               /* [T, d] the forward's out (storage dtype) */
    int64_t out_stride;            /* 0 means d */
    const float *out_gain;         /* [d] fp32, as the forward used */
    float out_eps;                 /* the forward's out_eps, > 0 */
    const void *dnormed;           /* [T, d] gradient of normed (storage dtype) */
    int64_t dnormed_stride;        /* 0 means d */
    float *dout_gain;              /* [d] fp32 gradient of out_gain, summed over
                                    * tokens like dquery; may be NULL (a gain
                                    * the caller does not train) */
} attnres_mix_backward_args;

/* Fills args with defaults: struct_size, scale 1, eps 1e-6, alpha 1,
 * out_eps 1e-6, flags 0, all pointers NULL, strides and workspace_size 0. */
ATTNRES_API void attnres_mix_backward_args_init(attnres_mix_backward_args *args);

/* The workspace a run of the plan (op ATTNRES_OP_MIX_BACKWARD) on up to T
 * tokens needs, in bytes, to *bytes: ask once at load for the largest T,
 * allocate it, and pass it to every run; nothing is allocated on the hot
 * path. EINVAL for a NULL plan or bytes, T < 0 or a size beyond size_t;
 * EMISMATCH for a plan of another op. */
ATTNRES_API int attnres_mix_backward_workspace_size(const attnres_plan *plan, int64_t T, size_t *bytes);

/* Runs the mix backward of a plan for an ATTNRES_OP_MIX_BACKWARD problem
 * on T tokens. Checks as attnres_run_mix does (views, strides, overlaps,
 * EINVAL/EMISMATCH with the reason in attnres_plan_errmsg), and that the
 * workspace is large enough and aligned. T = 0 writes dquery (and dalpha)
 * as zeros and touches nothing else. Never allocates, reads the database
 * or compiles. */
ATTNRES_API int attnres_run_mix_backward(attnres_plan *plan, int64_t T, const attnres_mix_backward_args *args,
                                         void *stream);

/* ------------------------------------------------------------------------
 * Training: the backwards of Block AttnRes' two phases (DESIGN §1b)
 *
 * A plan for a problem of op ATTNRES_OP_PHASE2_BACKWARD (the forward phase
 * 2's d, H, fuse_add and epilogue) takes phase 2's inputs and the gradient
 * of out (and of normed), and returns the gradients of o1 and lse, which
 * phase 1's backward takes, of the partial sum b (and of the sublayer
 * output with the fused add: the same values), and of the site's folded
 * query. The epilogue's backward needs no out: phase 2's out is recomputed
 * from o1 and b.
 *
 * A plan for a problem of op ATTNRES_OP_PHASE1_BACKWARD (the forward phase
 * 1's d, n, S and H) takes phase 1's inputs, every site's gradient of o1
 * and of lse, and returns the gradients of the n sources (summed over the
 * S sites, each source row read from memory once per token) and of the S
 * folded queries. A site without phase 2 (a block's first) has no gradient
 * of lse: its pointer, or the whole array, may be NULL.
 *
 * Both sum their query gradients (and d(out_gain)) over tokens as the mix
 * backward does: fixed groups of tokens write fp32 partial sums to the
 * caller's workspace (attnres_plan_workspace_size), added in group order;
 * bit-identical on every run and at every thread count, no atomics. Both
 * take ATTNRES_GRAD_ACCUMULATE (every per-token gradient added into the
 * caller's buffer); phase 1 also ATTNRES_GRAD_DSOURCES_F32. The CPU and
 * CUDA run them (tuned winners or built-in kernels). Phase 1's backward
 * takes at most 64 sites; on CUDA its per-token tables, 4 (3 N S H + 2 N)
 * bytes, and phase 2's, 4 (5 H + 84) bytes (8 H with the epilogue), must
 * fit 48 KiB of shared memory (a plan refuses bigger problems with EINVAL).
 * ---------------------------------------------------------------------- */

/* Arguments of one phase-2 backward launch (one site). Strides count
 * elements; 0 means d (H for lse and dlse). No output may overlap another
 * argument. */
typedef struct attnres_phase2_backward_args {
    size_t struct_size;        /* sizeof(attnres_phase2_backward_args); _init sets it */
    /* The forward's inputs, as attnres_phase2_args holds them. */
    const void *o1;            /* [T, d] the site's phase-1 output */
    int64_t o1_stride;
    const float *lse;          /* [T, H] fp32, the site's phase-1 lse */
    int64_t lse_stride;
    const void *partial;       /* b [T, d] as the forward used it: with fuse_add,
                                * partial after the forward's call (b + f) */
    int64_t partial_stride;
    const float *query;        /* [d] fp32, the site's folded u */
    float scale;               /* score scale, usually 1 */
    float eps;                 /* RMS epsilon, > 0 */
    const float *out_gain;     /* [d] fp32, epilogue only */
    float out_eps;             /* epilogue epsilon, > 0 */
    /* The incoming gradients. */
    const void *dout;          /* [T, d] gradient of out; may be NULL (zero)
                                * with the epilogue */
    int64_t dout_stride;
    const void *dnormed;       /* [T, d] gradient of normed, epilogue only */
    int64_t dnormed_stride;
    /* The gradients. */
    unsigned flags;            /* ATTNRES_GRAD_ACCUMULATE: add do1, dlse,
                                * dpartial and dsublayer into the buffers */
    void *do1;                 /* [T, d] gradient of o1 (storage dtype) */
    int64_t do1_stride;
    float *dlse;               /* [T, H] fp32 gradient of lse */
    int64_t dlse_stride;
    void *dpartial;            /* [T, d] gradient of b (and, with fuse_add, of
                                * partial before the add) */
    int64_t dpartial_stride;
    void *dsublayer;           /* [T, d] fuse_add only, may be NULL: the same
                                * values as dpartial */
    int64_t dsublayer_stride;
    float *dquery;             /* [d] fp32 gradient of u, summed over tokens */
    float *dout_gain;          /* [d] fp32, epilogue only, may be NULL */
    void *workspace;           /* attnres_plan_workspace_size bytes, 64-byte
                                * aligned, owned by the caller */
    size_t workspace_size;
} attnres_phase2_backward_args;

/* Fills args with defaults: struct_size, scale 1, eps 1e-6, out_eps 1e-6,
 * flags 0, pointers NULL, strides and workspace_size 0. */
ATTNRES_API void attnres_phase2_backward_args_init(attnres_phase2_backward_args *args);

/* Arguments of one phase-1 backward launch (the S sites of a block), with
 * the same conventions. With ATTNRES_GRAD_ACCUMULATE two source gradients
 * may be the very same view, as for the mix backward. */
typedef struct attnres_phase1_backward_args {
    size_t struct_size;            /* sizeof(attnres_phase1_backward_args); _init sets it */
    const void *const *sources;    /* n pointers, each a [T, d] view */
    const int64_t *source_strides; /* n token strides; NULL means all d */
    const float *queries;          /* [S, d] fp32, row j = site j's folded u */
    float scale;                   /* score scale, usually 1 */
    float eps;                     /* RMS epsilon, > 0 */
    const void *const *do1;        /* S pointers, each the [T, d] gradient of
                                    * o1 (storage dtype) */
    int64_t do1_stride;            /* every do1 view's stride; 0 means d */
    const float *const *dlse;      /* S pointers, each the [T, H] fp32 gradient
                                    * of lse (phase 2's backward gives it) or
                                    * NULL for zero; NULL: zero for every site */
    int64_t dlse_stride;           /* 0 means H */
    unsigned flags;                /* ATTNRES_GRAD_ACCUMULATE, ATTNRES_GRAD_DSOURCES_F32
                                    * (as attnres_mix_backward_args) */
    void *const *dsources;         /* n pointers, each a [T, d] view */
    const int64_t *dsource_strides;/* n token strides; NULL means all d */
    float *dqueries;               /* [S, d] fp32, row j the gradient of site
                                    * j's folded u, summed over tokens */
    void *workspace;               /* attnres_plan_workspace_size bytes, 64-byte
                                    * aligned, owned by the caller */
    size_t workspace_size;
} attnres_phase1_backward_args;

/* Fills args with defaults: struct_size, scale 1, eps 1e-6, flags 0,
 * pointers NULL, strides and workspace_size 0. */
ATTNRES_API void attnres_phase1_backward_args_init(attnres_phase1_backward_args *args);

/* The workspace a run of the plan on up to T tokens needs, in bytes, to
 * *bytes, for a plan of any op: 0 for the forward ops, and for the
 * backwards what attnres_run_*_backward expects in workspace. Ask once at
 * load for the largest T. EINVAL for a NULL plan or bytes, T < 0 or a size
 * beyond size_t. */
ATTNRES_API int attnres_plan_workspace_size(const attnres_plan *plan, int64_t T, size_t *bytes);

/* Runs the phase-1 backward of a plan for an ATTNRES_OP_PHASE1_BACKWARD
 * problem on T tokens; errors as attnres_run_mix_backward. T = 0 writes
 * dqueries as zeros and touches nothing else. */
ATTNRES_API int attnres_run_phase1_backward(attnres_plan *plan, int64_t T, const attnres_phase1_backward_args *args,
                                            void *stream);

/* Runs the phase-2 backward of a plan for an ATTNRES_OP_PHASE2_BACKWARD
 * problem on T tokens; errors as attnres_run_mix_backward. T = 0 writes
 * dquery (and dout_gain) as zeros and touches nothing else. */
ATTNRES_API int attnres_run_phase2_backward(attnres_plan *plan, int64_t T, const attnres_phase2_backward_args *args,
                                            void *stream);

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

/* Computes phase 1 in double precision on host memory, for a problem of op
 * ATTNRES_OP_PHASE1. sources: n pointers to [T, d] (token stride d);
 * queries: [S, d] folded; o1: [S, T, d] and lse: [S, T, H], both written by
 * the call and owned by the caller. Returns EINVAL with no output written
 * for a bad shape or a NULL pointer, ENOMEM if scratch space is lacking. */
ATTNRES_API int attnres_reference_phase1(const attnres_problem *problem,
                                         int64_t T,
                                         const double *const *sources,
                                         const double *queries, double scale,
                                         double eps, double *o1, double *lse);

/* Computes phase 2 in double precision on host memory, for a problem of op
 * ATTNRES_OP_PHASE2. o1: [T, d]; lse: [T, H]; partial: [T, d], updated in
 * place to partial + sublayer when problem->fuse_add (sublayer [T, d] is
 * then required, else ignored and may be NULL); query: [d] folded; out:
 * [T, d]; out_gain/normed may be NULL when epilogue is 0. Returns EINVAL
 * with nothing written for a bad shape or a NULL pointer. */
ATTNRES_API int attnres_reference_phase2(const attnres_problem *problem,
                                         int64_t T, const double *o1,
                                         const double *lse, double *partial,
                                         const double *sublayer,
                                         const double *query, double scale,
                                         double eps, const double *out_gain,
                                         double out_eps, double *out,
                                         double *normed);

/* ------------------------------------------------------------------------
 * fp64 backward reference (DESIGN §1b), the oracle for the gradients
 *
 * Each backward takes the forward's inputs as its forward reference does
 * (contiguous host doubles, token stride d, the query already folded),
 * recomputes r and the softmax weights from them, and takes the incoming
 * gradients of the forward's outputs. It returns:
 *   - per-token gradients ([T, d] or [T, H] buffers, like the inputs they
 *     belong to): written, or added into what the caller's buffer holds
 *     when flags has ATTNRES_GRAD_ACCUMULATE (one layer's output feeds
 *     many routing sites, and a trainer sums their gradients in place);
 *   - parameter gradients (the folded query u, the epilogue's gain, the
 *     additive form's alpha): summed over the T tokens in token order, in
 *     fp64, and always written (zero for T = 0), never accumulated; the
 *     same inputs give bit-identical results on every call.
 * ATTNRES_GRAD_DSOURCES_F32 is accepted by the backwards that return
 * source gradients (mix, phase 1) and changes nothing there, their
 * buffers being fp64 already; phase 2 refuses it.
 * An incoming gradient that is NULL counts as zero: the loss does not read
 * that output. A gradient output the caller does not train (dalpha,
 * dout_gain, dsublayer) may be NULL; every other output is needed.
 *
 * Every function checks before it writes anything: the problem (its op
 * must be the function's), T >= 0 with every buffer's size representable,
 * eps > 0 (and out_eps > 0 with the epilogue), no unknown flag bits, no
 * NULL pointer it needs, and that no output shares a byte with an input
 * or another output. Inputs may share memory with each other. With
 * ATTNRES_GRAD_ACCUMULATE two per-token gradient outputs of the same size
 * may be the very same buffer (same pointer): both gradients are added
 * into it, as when one tensor is two of the sources. On failure the
 * function returns EINVAL (ENOMEM when scratch space is lacking) with
 * nothing written, and a message naming the argument in msg (which may
 * be NULL; msg_len is then ignored).
 * ---------------------------------------------------------------------- */

/* Flags of the backward references and of attnres_mix_backward_args. */
#define ATTNRES_GRAD_ACCUMULATE 1u /* add per-token gradients into the
                                    * caller's buffers instead of writing */
#define ATTNRES_GRAD_DSOURCES_F32 2u /* the source gradients are fp32 views,
                                      * whatever the storage dtype */

/* The backward of attnres_reference_mix, for a problem of op
 * ATTNRES_OP_MIX (every H, both forms, the epilogue). Forward inputs as
 * attnres_reference_mix: sources (n pointers to [T, d]), query [d], scale,
 * eps, partial [T, d] (additive form), alpha, out_gain [d] and out_eps
 * (epilogue). Incoming gradients: dout [T, d] of out, dnormed [T, d] of
 * normed (epilogue; ignored otherwise), either NULL for zero. Outputs:
 * dsources (n pointers to [T, d], each needed), dquery [d] (the gradient
 * of the folded query u; attnres_reference_fold_query_backward turns it
 * into those of w and the gain), dpartial [T, d] (additive form, needed
 * there, ignored otherwise), dalpha (one double, additive form, may be
 * NULL), dout_gain [d] (epilogue, may be NULL). With N = 1 the softmax
 * weight is exactly 1 and the score gradient exactly 0: dsources[0] is the
 * gradient of the mix and dquery is exactly zero. */
ATTNRES_API int attnres_reference_mix_backward(
    const attnres_problem *problem, int64_t T, const double *const *sources,
    const double *query, double scale, double eps, const double *partial,
    double alpha, const double *out_gain, double out_eps, const double *dout,
    const double *dnormed, unsigned flags, double *const *dsources,
    double *dquery, double *dpartial, double *dalpha, double *dout_gain,
    char *msg, size_t msg_len);

/* The backward of attnres_reference_phase1, for a problem of op
 * ATTNRES_OP_PHASE1. Forward inputs as attnres_reference_phase1: sources
 * (n pointers to [T, d]), queries [S, d], scale, eps. Incoming gradients:
 * do1 [S, T, d] of o1, needed (zeros for a site whose o1 the loss does not
 * read), and dlse [S, T, H] of lse, which phase 2's backward returns (NULL
 * for zero, as for the first site of a block, which has no phase 2).
 * Outputs: dsources (n pointers to [T, d], each needed; each the sum over
 * the S sites) and dqueries [S, d], row j the gradient of site j's folded
 * query. */
ATTNRES_API int attnres_reference_phase1_backward(
    const attnres_problem *problem, int64_t T, const double *const *sources,
    const double *queries, double scale, double eps, const double *do1,
    const double *dlse, unsigned flags, double *const *dsources,
    double *dqueries, char *msg, size_t msg_len);

/* The backward of attnres_reference_phase2, for a problem of op
 * ATTNRES_OP_PHASE2 (every H, fuse_add, the epilogue). Forward inputs: o1
 * [T, d], lse [T, H], b [T, d] the partial sum as the forward used it
 * (with fuse_add the forward's partial after the call, which holds partial
 * + sublayer), query [d], scale, eps, out_gain [d] and out_eps (epilogue).
 * Incoming gradients: dout and dnormed as for the mix. Outputs, each
 * needed unless said: do1 [T, d], dlse [T, H] (for phase 1's backward),
 * db [T, d] (the gradient of b; with fuse_add also that of the partial
 * before the add), dsublayer [T, d] (fuse_add only, the same values as db,
 * may be NULL), dquery [d], dout_gain [d] (epilogue, may be NULL). */
ATTNRES_API int attnres_reference_phase2_backward(
    const attnres_problem *problem, int64_t T, const double *o1,
    const double *lse, const double *b, const double *query, double scale,
    double eps, const double *out_gain, double out_eps, const double *dout,
    const double *dnormed, unsigned flags, double *do1, double *dlse,
    double *db, double *dsublayer, double *dquery, double *dout_gain,
    char *msg, size_t msg_len);

/* The backward of folding the RMSNorm gain into the pseudo-query (u = gain
 * * w, attnres_fold_query), in double precision: dw = du * gain and dgain =
 * du * w, element by element over d. gain NULL means all ones (then dw =
 * du); dgain may be NULL (a gain the caller does not train). Returns
 * EINVAL with nothing written when d < 0, du, w or dw is NULL, or an
 * output overlaps another argument, with a message in msg (may be NULL). */
ATTNRES_API int attnres_reference_fold_query_backward(
    const double *du, const double *w, const double *gain, int64_t d,
    double *dw, double *dgain, char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif /* ATTNRES_H */
