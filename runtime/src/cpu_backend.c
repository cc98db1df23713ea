/*
 * cpu_backend.c - the CPU as a real device.
 *
 * Kernels are C from templates/cpu, compiled by the host compiler into
 * shared objects, loaded with dlopen and launched over the device's worker
 * threads. The built-in generic kernels are compiled into the library.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "binary_cache.h"
#include "cpu_compiler.h"
#include "cpu_builtin.h"
#include "cpu_kernel_abi.h"
#include "cpu_phase_abi.h"
#include "cpu_ceilings.h"
#include "cpu_pool.h"
#include "device.h"

/* Generated at build time from templates/cpu/<op>.lua (see CMakeLists):
 * each op's generic kernel and variant id per dtype. */
#define GENERIC_KERNELS(op, argt)                                                               \
    extern void (*const ar_generic_##op##_f32)(const struct argt *, int64_t, int64_t);         \
    extern void (*const ar_generic_##op##_bf16)(const struct argt *, int64_t, int64_t);        \
    extern void (*const ar_generic_##op##_f16)(const struct argt *, int64_t, int64_t);         \
    extern const char ar_generic_##op##_f32_variant[], ar_generic_##op##_bf16_variant[],       \
        ar_generic_##op##_f16_variant[]
GENERIC_KERNELS(mix, attnres_cpu_mix_args);
GENERIC_KERNELS(phase1, attnres_cpu_phase1_args);
GENERIC_KERNELS(phase2, attnres_cpu_phase2_args);
GENERIC_KERNELS(mix_backward, attnres_cpu_mix_backward_args);
GENERIC_KERNELS(phase1_backward, attnres_cpu_phase1_backward_args);
GENERIC_KERNELS(phase2_backward, attnres_cpu_phase2_backward_args);

/* An entry of cpu_load_generic's table. */
#define GENERIC_ENTRY(code, op)                                                                        \
    {code,                                                                                             \
     {(void *)ar_generic_##op##_f32, (void *)ar_generic_##op##_bf16, (void *)ar_generic_##op##_f16}, \
     {ar_generic_##op##_f32_variant, ar_generic_##op##_bf16_variant, ar_generic_##op##_f16_variant}}

/* The options in a build key: cpu_compiler.h's AR_CPU_CC_OPTIONS, which
 * say why -O2. */
#define CPU_COMPILE_OPTIONS "-O2 -march=native -std=gnu11 -fPIC -shared -Wno-psabi"

typedef struct cpu_state {
    cpu_pool *pool;
    char cc[256];
    int builtin_level; /* cpu_builtin.h: the widest ISA level of the built-in kernels, -1 scalar */
} cpu_state;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* ---- device identity ------------------------------------------------- */

static void read_cpu_model(char *name, size_t len)
{
    snprintf(name, len, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        char *colon = strchr(line, ':');
        if (!colon)
            break;
        colon++;
        while (*colon == ' ')
            colon++;
        colon[strcspn(colon, "\n")] = 0;
        snprintf(name, len, "%s", colon);
        break;
    }
    fclose(f);
}

static const char *cpu_isa(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return "x86_64-avx512";
    if (__builtin_cpu_supports("avx2"))
        return "x86_64-avx2";
    return "x86_64";
#elif defined(__aarch64__)
    return "aarch64";
#else
    return "unknown";
#endif
}

/* Runs `cc --version` and keeps its first line as the compiler identity.
 * The answer is kept for the process (and for children it forks), since
 * every CPU device of a process uses the same compiler. */
static char identity_cache[256];
static char identity_cc[256];
static pthread_mutex_t identity_lock = PTHREAD_MUTEX_INITIALIZER;

static void compiler_identity_uncached(const char *cc, char *out, size_t len)
{
    snprintf(out, len, "%.200s (version unknown)", cc);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --version 2>/dev/null", cc);
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    char line[256];
    if (fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = 0;
        if (*line)
            snprintf(out, len, "%s", line);
    }
    pclose(p);
}

static void compiler_identity(const char *cc, char *out, size_t len)
{
    pthread_mutex_lock(&identity_lock);
    if (!identity_cache[0] || strcmp(identity_cc, cc) != 0) {
        compiler_identity_uncached(cc, identity_cache, sizeof identity_cache);
        snprintf(identity_cc, sizeof identity_cc, "%s", cc);
    }
    snprintf(out, len, "%s", identity_cache);
    pthread_mutex_unlock(&identity_lock);
}

static void sweep_compile_dirs(void);

static int cpu_open(attnres_device *dev, int index)
{
    if (index != 0)
        return ar_device_fail(dev, ATTNRES_ENODEV, "there is one CPU device (cpu:0), not cpu:%d", index);
    cpu_state *st = calloc(1, sizeof *st);
    if (!st)
        return ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        cores = CPU_COUNT(&set);
    if (cores < 1)
        cores = 1;
    char why[256];
    int level = ar_cpu_builtin_level(why, sizeof why);
    if (level == -2) {
        free(st);
        return ar_device_fail(dev, ATTNRES_EINVAL, "%s", why);
    }
    st->builtin_level = level;
    if (cpu_pool_create((int)cores - 1, &st->pool) != 0) {
        free(st);
        return ar_device_fail(dev, ATTNRES_ENOMEM, "cannot start %ld worker threads", cores - 1);
    }
    /* Once per process: what compilers of killed processes left behind. */
    static pthread_once_t swept = PTHREAD_ONCE_INIT;
    pthread_once(&swept, sweep_compile_dirs);
    const char *cc = getenv("ATTNRES_CC");
    snprintf(st->cc, sizeof st->cc, "%s", cc && *cc ? cc : "cc");
    dev->state = st;
    snprintf(dev->backend, sizeof dev->backend, "cpu");
    read_cpu_model(dev->name, sizeof dev->name);
    snprintf(dev->arch, sizeof dev->arch, "%s", cpu_isa());
    dev->units = (int32_t)cores;
    dev->memory = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGESIZE);
    struct utsname u;
    snprintf(dev->driver, sizeof dev->driver, "%s", uname(&u) == 0 ? u.release : "unknown");
    compiler_identity(st->cc, dev->compiler, sizeof dev->compiler);
    snprintf(dev->options, sizeof dev->options, "%s", CPU_COMPILE_OPTIONS);
    snprintf(dev->target, sizeof dev->target, "%.60s %.190s", dev->arch, dev->name);
    return ATTNRES_OK;
}

static void cpu_close(attnres_device *dev)
{
    cpu_state *st = dev->state;
    if (!st)
        return;
    cpu_pool_destroy(st->pool);
    free(st);
    dev->state = NULL;
}

/* ---- compile and load ------------------------------------------------ */

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

/*
 * The C compiler works in a directory of its own, $TMPDIR/attnres-cc-PID-XXXXXX
 * (/tmp without TMPDIR), removed when the compile ends, whatever its outcome.
 * A process killed while it compiles cannot remove its directory, so the
 * next process to open the CPU device removes those of processes that are
 * gone. Gone means two things here, each of which alone could be wrong: no
 * process has the pid in the name (a pid from another pid namespace sharing
 * the directory would look gone), and nobody holds the flock that the
 * compiling process takes on the directory for as long as it uses it (a
 * lock is released by the kernel when its holder dies, in any namespace,
 * but there is a moment between making the directory and locking it).
 */
#define COMPILE_DIR_PREFIX "attnres-cc-"

static const char *temp_root(void)
{
    const char *d = getenv("TMPDIR");
    return d && *d ? d : "/tmp";
}

/* Removes the plain files in dir (the compiler writes no subdirectories)
 * and dir itself. */
static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                unlinkat(dirfd(d), de->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

static void sweep_compile_dirs(void)
{
    const char *root = temp_root();
    DIR *d = opendir(root);
    if (!d)
        return;
    size_t plen = strlen(COMPILE_DIR_PREFIX);
    pid_t self = getpid();
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, COMPILE_DIR_PREFIX, plen) != 0)
            continue;
        char *end;
        long pid = strtol(de->d_name + plen, &end, 10);
        /* Only names this scheme makes; older "attnres-cc-XXXXXX" ones
         * carry no owner and are left alone. */
        if (end == de->d_name + plen || *end != '-' || pid <= 0 || pid == (long)self)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive, or not ours to judge */
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", root, de->d_name);
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        /* Only our own user's directories: another user's are theirs to
         * clean, even when we could (as root). */
        struct stat sb;
        if (fstat(fd, &sb) == 0 && sb.st_uid == geteuid() && flock(fd, LOCK_EX | LOCK_NB) == 0)
            remove_dir(path);
        close(fd);
    }
    closedir(d);
}

static int cpu_compile(attnres_device *dev, const char *source,
                       const char *kernel_name, void **blob, size_t *size,
                       char **log)
{
    (void)kernel_name;
    cpu_state *st = dev->state;
    *blob = NULL;
    *size = 0;
    if (log)
        *log = NULL;
    char dir[4096];
    int dlen = snprintf(dir, sizeof dir, "%s/" COMPILE_DIR_PREFIX "%ld-XXXXXX", temp_root(), (long)getpid());
    if (dlen < 0 || (size_t)dlen >= sizeof dir - 16)
        return ar_device_fail(dev, ATTNRES_EIO, "the temporary directory's path is too long (TMPDIR=%.200s)",
                              temp_root());
    if (!mkdtemp(dir))
        return ar_device_fail(dev, ATTNRES_EIO, "cannot create a temporary directory in %s: %s", temp_root(),
                              strerror(errno));
    /* Held until the directory is removed; close-on-exec, so that the
     * compiler (which may outlive a killed owner) never holds it. */
    int lock = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (lock >= 0 && flock(lock, LOCK_EX) != 0) {
        close(lock);
        lock = -1;
    }
    char src[4200], obj[4200], logp[4200];
    snprintf(src, sizeof src, "%s/kernel.c", dir);
    snprintf(obj, sizeof obj, "%s/kernel.so", dir);
    snprintf(logp, sizeof logp, "%s/log.txt", dir);
    int status = ATTNRES_OK;
    if (write_text(src, source) != 0) {
        status = ar_device_fail(dev, ATTNRES_EIO, "cannot write %s", src);
        goto done;
    }
    /* The precompiled header where one can be had (cpu_compiler.h); a
     * compile that fails with it is tried once more without it, in case
     * the precompiled file is what is wrong, and then it goes (a kernel
     * that fails both ways leaves it be). */
    char pch[4200];
    int with_pch = ar_cpu_pch(st->cc, dev->compiler, dir, pch, sizeof pch) == 0;
    int spawn_error = 0, ws;
    for (;;) {
        char *const options[] = {AR_CPU_CC_OPTIONS};
        char *argv[32];
        size_t a = 0;
        argv[a++] = st->cc;
        for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
            argv[a++] = options[i];
        if (with_pch == 1) {
            argv[a++] = "-include";
            argv[a++] = pch;
        }
        char *const tail[] = {"-shared", "-o", obj, src, "-lm", NULL};
        memcpy(argv + a, tail, sizeof tail);
        ws = ar_cc_run(argv, logp, &spawn_error);
        int compiled = ws >= 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
        if (with_pch == 2 && compiled)
            ar_cpu_pch_drop(pch);
        if (ws < 0 || compiled || with_pch != 1)
            break;
        with_pch = 2; /* the retry, without it */
    }
    if (ws < 0) {
        status = ar_device_fail(dev, ATTNRES_ECOMPILE, "cannot run the C compiler '%s': %s", st->cc,
                                strerror(spawn_error));
        goto done;
    }
    void *text = NULL;
    size_t text_len = 0;
    if (ar_read_file(logp, &text, &text_len) == 0 && log && text_len)
        *log = text;
    else
        free(text);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        status = ar_device_fail(dev, ATTNRES_ECOMPILE, "the C compiler failed on %s%s%.400s", kernel_name,
                                log && *log ? ": " : "", log && *log ? *log : "");
        goto done;
    }
    if (ar_read_file(obj, blob, size) != 0)
        status = ar_device_fail(dev, ATTNRES_ECOMPILE, "the C compiler wrote no object for %s", kernel_name);
    else if (ar_blob_seal(blob, size) != 0) /* cpu_load checks the seal */
        status = ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory sealing the object of %s", kernel_name);
    if (status != ATTNRES_OK) {
        free(*blob);
        *blob = NULL;
        *size = 0;
    }
done:
    remove_dir(dir);
    if (lock >= 0)
        close(lock);
    return status;
}

/* Puts the shared object where dlopen can read it: the content-addressed
 * cache, or an anonymous memory file when no cache directory is usable. */
static void *open_object(const void *blob, size_t size, const char *key, char *err, size_t err_len)
{
    char path[4200];
    if (ar_cache_path(key, "", path, sizeof path) == 0 && ar_cache_store(path, blob, size) == 0) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h)
            snprintf(err, err_len, "%s", dlerror());
        return h;
    }
    int fd = memfd_create("attnres-kernel", MFD_CLOEXEC);
    if (fd < 0 || write(fd, blob, size) != (ssize_t)size) {
        if (fd >= 0)
            close(fd);
        snprintf(err, err_len, "no usable cache directory and no memory file");
        return NULL;
    }
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        snprintf(err, err_len, "%s", dlerror());
    close(fd);
    return h;
}

/* The most workers a kernel's thread count may ask for: what the built-in
 * kernels ask for to mean "all of them". */
#define CPU_MAX_KERNEL_THREADS (1 << 20)

/* A loaded kernel's thread count. It is a launch parameter: the variant's
 * parameters carry it ("threads" in params_json), so that variants that
 * differ only in it share one source and one binary. Binaries generated
 * before that export it as <kernel>_threads, which wins where present.
 * 0 with a message in dev when neither gives a usable count. */
static int kernel_threads(attnres_device *dev, void *module, const char *kernel_name, const char *params_json)
{
    char sym[256];
    snprintf(sym, sizeof sym, "%s_threads", kernel_name);
    const int *exported = dlsym(module, sym);
    const int64_t none = INT64_MIN;
    const int64_t threads = exported ? *exported : ar_json_int(params_json, "threads", none);
    if (threads >= 1 && threads <= CPU_MAX_KERNEL_THREADS)
        return (int)threads;
    if (threads == none)
        ar_device_fail(dev, ATTNRES_ELOAD,
                       "kernel %s has no thread count: its binary exports no %s and its parameters (%.200s) "
                       "hold no \"threads\"",
                       kernel_name, sym, params_json ? params_json : "none given");
    else
        ar_device_fail(dev, ATTNRES_ELOAD, "kernel %s asks for %lld threads in its %s (1 to %d)", kernel_name,
                       (long long)threads, exported ? "binary" : "parameters", CPU_MAX_KERNEL_THREADS);
    return 0;
}

static int cpu_load(attnres_device *dev, const void *blob, size_t size, const char *source,
                    const char *kernel_name, const char *params_json, ar_kernel *k)
{
    (void)source; /* the host compiler's output always suits the host */
    /* Only what the compiler wrote, intact, reaches dlopen: a damaged
     * shared object can crash the dynamic loader or the kernel. */
    int seal = ar_blob_check(blob, size);
    if (seal != 0)
        return ar_device_fail(dev, ATTNRES_ELOAD, "cannot load kernel %s: %s", kernel_name,
                              seal == -2 ? "the binary is damaged (its checksum seal does not match)"
                                         : "the binary has no checksum seal (cut short, or compiled by an older attnres)");
    char err[512] = "";
    void *h = open_object(blob, size, k->build_key[0] ? k->build_key : kernel_name, err, sizeof err);
    if (!h)
        return ar_device_fail(dev, ATTNRES_ELOAD, "cannot load kernel %s: %s", kernel_name, err);
    char sym[256];
    snprintf(sym, sizeof sym, "%s_abi", kernel_name);
    const int *abi = dlsym(h, sym);
    void *entry = dlsym(h, kernel_name);
    if (!abi || !entry) {
        dlclose(h);
        return ar_device_fail(dev, ATTNRES_ELOAD, "binary does not define kernel %s and its ABI version", kernel_name);
    }
    snprintf(sym, sizeof sym, "%s_abi_op", kernel_name);
    const int *abi_op = dlsym(h, sym);
    char why[200];
    if (!ar_kernel_abi_ok(AR_CPU_ABI_VERSIONS, *abi, abi_op ? *abi_op : -1, why, sizeof why)) {
        dlclose(h);
        return ar_device_fail(dev, ATTNRES_ELOAD, "kernel %s: %s", kernel_name, why);
    }
    const int threads = kernel_threads(dev, h, kernel_name, params_json);
    if (threads == 0) {
        dlclose(h);
        return ATTNRES_ELOAD;
    }
    k->module = h;
    k->entry = entry;
    k->threads = threads;
    snprintf(k->kernel_name, sizeof k->kernel_name, "%s", kernel_name);
    return ATTNRES_OK;
}

/* Most sources on the stack of a launch; larger N would need the heap,
 * which the hot path must not touch. */
#define CPU_MAX_SOURCES 256

/* An upper bound of the per-token state the CPU kernels keep on the stack
 * of the thread that runs them (the arrays the templates size by d, N, H
 * and S, and a few vectors per source): the formula attnres.h states. */
static int64_t cpu_stack_bytes(const attnres_problem *p)
{
    const int64_t d = p->d, n = p->n, h = p->heads;
    if (p->op == ATTNRES_OP_PHASE1)
        return 4 * (n * p->s * h + 4 * h + d) + 16 * n;
    if (p->op == ATTNRES_OP_MIX_BACKWARD) /* the epilogue's do row, in row and in pair order */
        return 8 * d + 16 * n * h + 8 * n + 256 + (p->epilogue ? 8 * d : 0);
    if (p->op == ATTNRES_OP_PHASE1_BACKWARD) /* per source, site and head: q, p, the weight, dz; per site
                                              * a column block's padded rows of u, do1 and du */
        return 16 * n * p->s * h + 8 * n + 12 * (int64_t)p->s * AR_CPU_PHASE1_BACKWARD_PAD + 256;
    if (p->op == ATTNRES_OP_PHASE2_BACKWARD) /* the epilogue's out and do rows */
        return 16 * h + 256 + (p->epilogue ? 8 * d : 0);
    return 16 * d + 8 * n * h + 16 * h + 192 * n;
}

static int cpu_check_problem(attnres_device *dev, const attnres_problem *p)
{
    const attnres_op fwd = ar_op_forward(p->op);
    if (fwd != ATTNRES_OP_PHASE2 && p->n > CPU_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the CPU kernels take at most %d sources (N = %d)",
                              CPU_MAX_SOURCES, p->n);
    if (fwd == ATTNRES_OP_PHASE1 && (int64_t)p->n * p->s * p->heads > AR_CPU_PHASE1_MAX_WEIGHTS)
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "%s with n*S*H = %lld softmax weights per token exceeds the CPU kernels' %d",
                              ar_op_name(p->op), (long long)p->n * p->s * p->heads, AR_CPU_PHASE1_MAX_WEIGHTS);
    if (p->op == ATTNRES_OP_PHASE1_BACKWARD && p->s > AR_CPU_PHASE1_BACKWARD_MAX_SITES)
        return ar_device_fail(dev, ATTNRES_EINVAL, "phase1_backward takes at most %d sites (S = %d)",
                              AR_CPU_PHASE1_BACKWARD_MAX_SITES, p->s);
    const int64_t stack = cpu_stack_bytes(p);
    if (stack > ATTNRES_CPU_STACK_MAX)
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "d = %lld, N = %d, H = %d needs %lld bytes of per-token state on the stack, more "
                              "than the CPU kernels may use (ATTNRES_CPU_STACK_MAX = %d)",
                              (long long)p->d, p->n, p->heads, (long long)stack, ATTNRES_CPU_STACK_MAX);
    return ATTNRES_OK;
}

/* One row of the table of built-in kernels: an op's three dtypes. */
typedef struct generic_entry {
    attnres_op op;
    void *entry[3];          /* by attnres_dtype */
    const char *variant[3];
} generic_entry;

/* The length of a CPU variant id without its thread count (a trailing
 * "_t" and digits): what its kernel symbol is named after, since the
 * thread count is set at launch. */
static int id_without_threads(const char *id)
{
    size_t n = strlen(id), digits = 0;
    while (digits < n && id[n - 1 - digits] >= '0' && id[n - 1 - digits] <= '9')
        digits++;
    if (digits > 0 && n >= digits + 2 && id[n - digits - 2] == '_' && id[n - digits - 1] == 't')
        n -= digits + 2;
    return (int)n;
}

static int cpu_load_generic(attnres_device *dev, const attnres_problem *p, ar_kernel *k)
{
    const generic_entry table[] = {
        GENERIC_ENTRY(ATTNRES_OP_MIX, mix),
        GENERIC_ENTRY(ATTNRES_OP_PHASE1, phase1),
        GENERIC_ENTRY(ATTNRES_OP_PHASE2, phase2),
        GENERIC_ENTRY(ATTNRES_OP_MIX_BACKWARD, mix_backward),
        GENERIC_ENTRY(ATTNRES_OP_PHASE1_BACKWARD, phase1_backward),
        GENERIC_ENTRY(ATTNRES_OP_PHASE2_BACKWARD, phase2_backward),
    };
    memset(k, 0, sizeof *k);
    const int dt = (int)p->dtype;
    const cpu_state *st = dev->state;
    void *entry = NULL;
    const char *variant = NULL, *level = NULL;
    if (p->heads > 0 &&
        ar_cpu_builtin_find(st->builtin_level, (int)p->op, dt, p->d / p->heads, &entry, &variant, &level) == 0) {
        k->entry = entry;
        k->threads = CPU_MAX_KERNEL_THREADS; /* all workers */
        snprintf(k->variant, sizeof k->variant, "%s", variant);
        snprintf(k->kernel_name, sizeof k->kernel_name, "attnres_%.*s_%s (built in, %s)", id_without_threads(variant),
                 variant, level, level);
        return ATTNRES_OK;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (table[i].op != p->op)
            continue;
        if (dt < 0 || dt > 2)
            break;
        k->entry = table[i].entry[dt];
        k->threads = CPU_MAX_KERNEL_THREADS; /* all workers */
        snprintf(k->variant, sizeof k->variant, "%s", table[i].variant[dt]);
        snprintf(k->kernel_name, sizeof k->kernel_name, "attnres_%.*s (built in, scalar)",
                 id_without_threads(table[i].variant[dt]), table[i].variant[dt]);
        return ATTNRES_OK;
    }
    return ar_device_fail(dev, ATTNRES_EINVAL, "no generic kernel for op %d, dtype %d", (int)p->op, dt);
}

static void cpu_unload(attnres_device *dev, ar_kernel *k)
{
    (void)dev;
    if (k->module)
        dlclose(k->module);
    k->module = NULL;
    k->entry = NULL;
}

/* ---- launch ---------------------------------------------------------- */

/* One launch split over the pool: the kernel of one op and its argument
 * struct, which every part shares, each part running tokens [t0, t1). */
typedef struct cpu_run {
    attnres_op op;
    void *entry;
    union {
        struct attnres_cpu_mix_args mix;
        struct attnres_cpu_phase1_args phase1;
        struct attnres_cpu_phase2_args phase2;
    } args;
} cpu_run;

static void run_chunk(void *ctx, int64_t t0, int64_t t1)
{
    const cpu_run *r = ctx;
    switch (r->op) {
    case ATTNRES_OP_MIX:
        ((ar_cpu_mix_fn)r->entry)(&r->args.mix, t0, t1);
        break;
    case ATTNRES_OP_PHASE1:
        ((ar_cpu_phase1_fn)r->entry)(&r->args.phase1, t0, t1);
        break;
    case ATTNRES_OP_PHASE2:
        ((ar_cpu_phase2_fn)r->entry)(&r->args.phase2, t0, t1);
        break;
    case ATTNRES_OP_MIX_BACKWARD: /* the backwards split by groups of tokens, with their own chunks */
    case ATTNRES_OP_PHASE1_BACKWARD:
    case ATTNRES_OP_PHASE2_BACKWARD:
        break;
    }
}

/* The parts a launch is split into: a tuned kernel's measured thread
 * count; a built-in kernel (no module) spreads only launches that move
 * enough data, `rows` rows of d per token, to pay for waking the workers
 * (cpu_builtin.h). */
static int launch_parts(const ar_kernel *k, const attnres_problem *p, int64_t T, int64_t rows)
{
    int parts = k->threads < 1 ? 1 : k->threads;
    if (!k->module)
        parts = ar_cpu_builtin_parts(T * p->d * (int64_t)attnres_dtype_size(p->dtype) * rows, parts);
    return parts;
}

/* Runs r on T tokens over the pool, in launch_parts parts. */
static int run_split(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T, cpu_run *r,
                     int64_t rows)
{
    cpu_state *st = dev->state;
    r->op = p->op;
    r->entry = k->entry;
    cpu_pool_run(st->pool, run_chunk, r, T, launch_parts(k, p, T, rows));
    return ATTNRES_OK;
}

/* Refuses a launch of the mix or its backward with more sources than the
 * CPU backend's tables hold. */
static int sources_fit(attnres_device *dev, const attnres_problem *p)
{
    if (p->n > CPU_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "the CPU backend supports at most %d sources (N = %d)",
                              CPU_MAX_SOURCES, p->n);
    return ATTNRES_OK;
}

/* The sources' token strides, 0 (or none given) meaning d. */
static void source_strides(const attnres_problem *p, const int64_t *given, int64_t *strides)
{
    for (int i = 0; i < p->n; i++)
        strides[i] = given && given[i] ? given[i] : p->d;
}

static int cpu_launch_mix(attnres_device *dev, const ar_kernel *k,
                          const attnres_problem *p, int64_t T,
                          const attnres_mix_args *a, void *stream)
{
    (void)stream;
    int rc = sources_fit(dev, p);
    if (rc != ATTNRES_OK)
        return rc;
    int64_t strides[CPU_MAX_SOURCES];
    source_strides(p, a->source_strides, strides);
    cpu_run r;
    r.args.mix = (struct attnres_cpu_mix_args){
        .d = p->d, .n = p->n, .heads = p->heads,
        .src = a->sources, .src_stride = strides,
        .query = a->query, .scale = a->scale, .eps = a->eps,
        .partial = p->form == ATTNRES_FORM_ADDITIVE ? a->partial : NULL,
        .partial_stride = a->partial_stride ? a->partial_stride : p->d,
        .alpha = a->alpha,
        .out = a->out, .out_stride = a->out_stride ? a->out_stride : p->d,
        .out_gain = a->out_gain, .out_eps = a->out_eps,
        .normed = p->epilogue ? a->normed : NULL,
        .normed_stride = a->normed_stride ? a->normed_stride : p->d,
    };
    return run_split(dev, k, p, T, &r, p->n + 1 + (p->form == ATTNRES_FORM_ADDITIVE) + p->epilogue);
}

static int cpu_launch_phase1(attnres_device *dev, const ar_kernel *k,
                             const attnres_problem *p, int64_t T,
                             const attnres_phase1_args *a, void *stream)
{
    (void)stream;
    if (p->n > CPU_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "the CPU backend runs phase1 on at most %d sources (got %d)",
                              CPU_MAX_SOURCES, p->n);
    if ((int64_t)p->n * p->s * p->heads > AR_CPU_PHASE1_MAX_WEIGHTS)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED,
                              "phase1 with n*S*H = %lld softmax weights per token exceeds the CPU backend's %d",
                              (long long)p->n * p->s * p->heads, AR_CPU_PHASE1_MAX_WEIGHTS);
    int64_t strides[CPU_MAX_SOURCES];
    source_strides(p, a->source_strides, strides);
    cpu_run r;
    r.args.phase1 = (struct attnres_cpu_phase1_args){
        .d = p->d, .n = p->n, .heads = p->heads, .s = p->s,
        .src = a->sources, .src_stride = strides,
        .queries = a->queries, .scale = a->scale, .eps = a->eps,
        .o1 = a->o1, .o1_stride = a->o1_stride ? a->o1_stride : p->d,
        .lse = a->lse, .lse_stride = a->lse_stride ? a->lse_stride : p->heads,
    };
    return run_split(dev, k, p, T, &r, p->n + p->s);
}

static int cpu_launch_phase2(attnres_device *dev, const ar_kernel *k,
                             const attnres_problem *p, int64_t T,
                             const attnres_phase2_args *a, void *stream)
{
    (void)stream;
    cpu_run r;
    r.args.phase2 = (struct attnres_cpu_phase2_args){
        .d = p->d, .heads = p->heads,
        .o1 = a->o1, .o1_stride = a->o1_stride ? a->o1_stride : p->d,
        .lse = a->lse, .lse_stride = a->lse_stride ? a->lse_stride : p->heads,
        .partial = a->partial, .partial_stride = a->partial_stride ? a->partial_stride : p->d,
        .sublayer = p->fuse_add ? a->sublayer : NULL,
        .sublayer_stride = a->sublayer_stride ? a->sublayer_stride : p->d,
        .query = a->query, .scale = a->scale, .eps = a->eps,
        .out = a->out, .out_stride = a->out_stride ? a->out_stride : p->d,
        .out_gain = a->out_gain, .out_eps = a->out_eps,
        .normed = p->epilogue ? a->normed : NULL,
        .normed_stride = a->normed_stride ? a->normed_stride : p->d,
    };
    return run_split(dev, k, p, T, &r, 3 + 2 * p->fuse_add + p->epilogue);
}

typedef struct mix_backward_launch {
    ar_cpu_mix_backward_fn fn;
    struct attnres_cpu_mix_backward_args args;
    int64_t T;
} mix_backward_launch;

/* Groups [g0, g1): their tokens, in one call, which starts on a group's
 * first token as the kernels require. */
static void mix_backward_chunk(void *ctx, int64_t g0, int64_t g1)
{
    mix_backward_launch *l = ctx;
    const int64_t t1 = g1 * AR_GRAD_GROUP;
    l->fn(&l->args, g0 * AR_GRAD_GROUP, t1 < l->T ? t1 : l->T);
}

/* The second pass over the groups' rows of du (and of d(out_gain) with
 * the epilogue): each element is the sum of its groups in group order,
 * whichever thread adds it, so the result is the same at every thread
 * count. */
typedef struct group_sum {
    const float *rows[2];
    float *out[2];
    int64_t groups, d;
} group_sum;

static void group_sum_chunk(void *ctx, int64_t k0, int64_t k1)
{
    const group_sum *s = ctx;
    for (int w = 0; w < 2; w++) {
        float *out = s->out[w];
        if (!out)
            continue;
        for (int64_t k = k0; k < k1; k++)
            out[k] = s->rows[w][k];
        for (int64_t g = 1; g < s->groups; g++) {
            const float *row = s->rows[w] + g * s->d;
            for (int64_t k = k0; k < k1; k++)
                out[k] += row[k];
        }
    }
}

static int cpu_launch_mix_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                   const attnres_mix_backward_args *a)
{
    cpu_state *st = dev->state;
    int rc = sources_fit(dev, p);
    if (rc != ATTNRES_OK)
        return rc;
    const int additive = p->form == ATTNRES_FORM_ADDITIVE, epilogue = p->epilogue != 0;
    float *const dout_gain = epilogue ? a->dout_gain : NULL;
    if (T == 0) { /* sums over no tokens */
        memset(a->dquery, 0, sizeof(float) * (size_t)p->d);
        if (dout_gain)
            memset(dout_gain, 0, sizeof(float) * (size_t)p->d);
        if (additive && a->dalpha)
            *a->dalpha = 0.0f;
        return ATTNRES_OK;
    }
    ar_backward_ws ws = {0};
    int fits = ar_backward_workspace_fits(dev, p->d, T, epilogue, a->workspace, a->workspace_size, &ws);
    if (fits != ATTNRES_OK)
        return fits;
    if (epilogue && (!a->out || !a->out_gain || !a->dnormed))
        return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue's backward needs out, out_gain and dnormed");
    if (!epilogue && !a->dout)
        return ar_device_fail(dev, ATTNRES_EINVAL, "dout is NULL");
    int64_t strides[CPU_MAX_SOURCES], dstrides[CPU_MAX_SOURCES];
    for (int i = 0; i < p->n; i++) {
        strides[i] = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        dstrides[i] = a->dsource_strides && a->dsource_strides[i] ? a->dsource_strides[i] : p->d;
    }
    float *ws_du = a->workspace, *ws_dalpha = (float *)((char *)a->workspace + ws.alpha_offset),
          *ws_dgout = (float *)((char *)a->workspace + ws.dgout_offset);
    mix_backward_launch l;
    l.fn = (ar_cpu_mix_backward_fn)k->entry;
    l.T = T;
    l.args = (struct attnres_cpu_mix_backward_args){
        .d = p->d, .n = p->n, .heads = p->heads,
        .src = a->sources, .src_stride = strides,
        .query = a->query, .scale = a->scale, .eps = a->eps,
        .alpha = additive ? a->alpha : 1.0f,
        .accumulate = (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0,
        .dsrc_f32 = (a->flags & ATTNRES_GRAD_DSOURCES_F32) != 0,
        .dout = a->dout, .dout_stride = a->dout_stride ? a->dout_stride : p->d,
        .dsrc = a->dsources, .dsrc_stride = dstrides,
        .dpartial = additive ? a->dpartial : NULL,
        .dpartial_stride = a->dpartial_stride ? a->dpartial_stride : p->d,
        .ws_du = ws_du, .ws_dalpha = additive ? ws_dalpha : NULL,
        .group = AR_GRAD_GROUP,
        .out = epilogue ? a->out : NULL,
        .out_stride = a->out_stride ? a->out_stride : p->d,
        .out_gain = epilogue ? a->out_gain : NULL,
        .out_eps = a->out_eps,
        .dnormed = epilogue ? a->dnormed : NULL,
        .dnormed_stride = a->dnormed_stride ? a->dnormed_stride : p->d,
        .ws_dgout = epilogue ? ws_dgout : NULL,
    };
    const int64_t groups = (T + AR_GRAD_GROUP - 1) / AR_GRAD_GROUP;
    /* Sources read, dout, and the source gradients written (read too when
     * accumulated): what decides whether the built-in kernel spreads. */
    int parts = launch_parts(k, p, groups * AR_GRAD_GROUP, 2 * p->n + 1 + 2 * additive + 2 * epilogue);
    cpu_pool_run(st->pool, mix_backward_chunk, &l, groups, parts);
    group_sum s = {{ws_du, ws_dgout}, {a->dquery, dout_gain}, groups, p->d};
    const int64_t cols = p->d;
    int sum_parts = launch_parts(k, p, groups, 1);
    cpu_pool_run(st->pool, group_sum_chunk, &s, cols, sum_parts);
    if (additive && a->dalpha) {
        float sum = 0.0f;
        for (int64_t g = 0; g < groups; g++)
            sum += ws_dalpha[g];
        *a->dalpha = sum;
    }
    return ATTNRES_OK;
}

/* ---- the phase backwards -------------------------------------------- */

/* One phase backward launch split by groups of tokens, as the mix
 * backward's. */
typedef struct phase_backward_launch {
    attnres_op op;
    void *entry;
    union {
        struct attnres_cpu_phase1_backward_args phase1;
        struct attnres_cpu_phase2_backward_args phase2;
    } args;
    int64_t T;
} phase_backward_launch;

static void phase_backward_chunk(void *ctx, int64_t g0, int64_t g1)
{
    const phase_backward_launch *l = ctx;
    const int64_t t0 = g0 * AR_GRAD_GROUP, t1 = g1 * AR_GRAD_GROUP < l->T ? g1 * AR_GRAD_GROUP : l->T;
    if (l->op == ATTNRES_OP_PHASE1_BACKWARD)
        ((ar_cpu_phase1_backward_fn)l->entry)(&l->args.phase1, t0, t1);
    else
        ((ar_cpu_phase2_backward_fn)l->entry)(&l->args.phase2, t0, t1);
}

/* Runs l over T's groups in `parts`, then adds the groups' rows of width
 * `row` (and the epilogue's d(out_gain) rows) in group order into out
 * (and dout_gain). */
static void phase_backward_run(cpu_state *st, const ar_kernel *k, const attnres_problem *p, phase_backward_launch *l,
                               int64_t rows, const float *ws_du, float *out, int64_t row, const float *ws_dgout,
                               float *dout_gain)
{
    const int64_t groups = (l->T + AR_GRAD_GROUP - 1) / AR_GRAD_GROUP;
    cpu_pool_run(st->pool, phase_backward_chunk, l, groups, launch_parts(k, p, groups * AR_GRAD_GROUP, rows));
    group_sum s = {{ws_du, ws_dgout}, {out, dout_gain}, groups, row};
    cpu_pool_run(st->pool, group_sum_chunk, &s, row, launch_parts(k, p, groups, 1));
}

static int cpu_launch_phase1_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                      const attnres_phase1_backward_args *a)
{
    const int64_t row = p->d * p->s; /* a group's du: one row of d per site */
    if (T == 0) {
        memset(a->dqueries, 0, sizeof(float) * (size_t)row);
        return ATTNRES_OK;
    }
    int rc = sources_fit(dev, p);
    ar_backward_ws ws;
    if (rc != ATTNRES_OK || (rc = ar_backward_workspace_fits(dev, row, T, 0, a->workspace, a->workspace_size, &ws)))
        return rc;
    int64_t strides[CPU_MAX_SOURCES], dstrides[CPU_MAX_SOURCES];
    for (int i = 0; i < p->n; i++) {
        strides[i] = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        dstrides[i] = a->dsource_strides && a->dsource_strides[i] ? a->dsource_strides[i] : p->d;
    }
    phase_backward_launch l = {.op = p->op, .entry = k->entry, .T = T};
    l.args.phase1 = (struct attnres_cpu_phase1_backward_args){
        .d = p->d, .n = p->n, .heads = p->heads, .s = p->s,
        .accumulate = (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0,
        .dsrc_f32 = (a->flags & ATTNRES_GRAD_DSOURCES_F32) != 0,
        .src = a->sources, .src_stride = strides,
        .queries = a->queries, .scale = a->scale, .eps = a->eps,
        .do1 = a->do1, .do1_stride = a->do1_stride ? a->do1_stride : p->d,
        .dlse = a->dlse, .dlse_stride = a->dlse_stride ? a->dlse_stride : p->heads,
        .dsrc = a->dsources, .dsrc_stride = dstrides,
        .ws_du = a->workspace, .group = AR_GRAD_GROUP,
    };
    /* Sources read and their gradients written, and the sites' do1. */
    phase_backward_run(dev->state, k, p, &l, 2 * p->n + p->s, a->workspace, a->dqueries, row, NULL, NULL);
    return ATTNRES_OK;
}

static int cpu_launch_phase2_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                      const attnres_phase2_backward_args *a)
{
    const int epilogue = p->epilogue != 0;
    float *const dout_gain = epilogue ? a->dout_gain : NULL;
    if (T == 0) {
        memset(a->dquery, 0, sizeof(float) * (size_t)p->d);
        if (dout_gain)
            memset(dout_gain, 0, sizeof(float) * (size_t)p->d);
        return ATTNRES_OK;
    }
    ar_backward_ws ws;
    int rc = ar_backward_workspace_fits(dev, p->d, T, epilogue, a->workspace, a->workspace_size, &ws);
    if (rc != ATTNRES_OK)
        return rc;
    if (epilogue ? !a->out_gain || !a->dnormed : !a->dout)
        return ar_device_fail(dev, ATTNRES_EINVAL, "%s", epilogue ? "the epilogue's backward needs out_gain and dnormed"
                                                                  : "dout is NULL");
    float *const ws_dgout = (float *)((char *)a->workspace + ws.dgout_offset);
    phase_backward_launch l = {.op = p->op, .entry = k->entry, .T = T};
    l.args.phase2 = (struct attnres_cpu_phase2_backward_args){
        .d = p->d, .heads = p->heads,
        .accumulate = (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0,
        .o1 = a->o1, .o1_stride = a->o1_stride ? a->o1_stride : p->d,
        .lse = a->lse, .lse_stride = a->lse_stride ? a->lse_stride : p->heads,
        .partial = a->partial, .partial_stride = a->partial_stride ? a->partial_stride : p->d,
        .query = a->query, .scale = a->scale, .eps = a->eps,
        .dout = a->dout, .dout_stride = a->dout_stride ? a->dout_stride : p->d,
        .do1 = a->do1, .do1_stride = a->do1_stride ? a->do1_stride : p->d,
        .dlse = a->dlse, .dlse_stride = a->dlse_stride ? a->dlse_stride : p->heads,
        .dpartial = a->dpartial, .dpartial_stride = a->dpartial_stride ? a->dpartial_stride : p->d,
        .dsublayer = p->fuse_add ? a->dsublayer : NULL,
        .dsublayer_stride = a->dsublayer_stride ? a->dsublayer_stride : p->d,
        .ws_du = a->workspace, .group = AR_GRAD_GROUP,
        .out_gain = epilogue ? a->out_gain : NULL, .out_eps = a->out_eps,
        .dnormed = epilogue ? a->dnormed : NULL,
        .dnormed_stride = a->dnormed_stride ? a->dnormed_stride : p->d,
        .ws_dgout = epilogue ? ws_dgout : NULL,
    };
    /* o1, b, dout read; do1, db written (and dsublayer; dnormed read). */
    const int64_t rows = 5 + (l.args.phase2.dsublayer != NULL) + epilogue;
    phase_backward_run(dev->state, k, p, &l, rows, a->workspace, a->dquery, p->d, epilogue ? ws_dgout : NULL,
                       dout_gain);
    return ATTNRES_OK;
}

/* The op-generic launch: one switch over the tagged arguments. */
static int cpu_launch(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                      const ar_op_args *a, void *stream)
{
    if (!a || a->op != p->op)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the arguments are for op %d, the problem is op %d",
                              a ? (int)a->op : -1, (int)p->op);
    if (!a->mix) /* every member of the union is a pointer: one test covers them */
        return ar_device_fail(dev, ATTNRES_EINVAL, "the operation's arguments are NULL");
    if (T < 0)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld is negative", (long long)T);
    /* As on CUDA: nothing to run, no argument touched, but for the
     * backwards' sums over no tokens. */
    if (T == 0 && ar_op_forward(a->op) == a->op)
        return ATTNRES_OK;
    switch (a->op) {
    case ATTNRES_OP_MIX: return cpu_launch_mix(dev, k, p, T, a->mix, stream);
    case ATTNRES_OP_PHASE1: return cpu_launch_phase1(dev, k, p, T, a->phase1, stream);
    case ATTNRES_OP_PHASE2: return cpu_launch_phase2(dev, k, p, T, a->phase2, stream);
    case ATTNRES_OP_MIX_BACKWARD: return cpu_launch_mix_backward(dev, k, p, T, a->mix_backward);
    case ATTNRES_OP_PHASE1_BACKWARD: return cpu_launch_phase1_backward(dev, k, p, T, a->phase1_backward);
    case ATTNRES_OP_PHASE2_BACKWARD: return cpu_launch_phase2_backward(dev, k, p, T, a->phase2_backward);
    }
    return ar_device_fail(dev, ATTNRES_EINVAL, "unknown op %d", (int)a->op);
}

/* ---- memory and timing ----------------------------------------------- */

static int cpu_mem_alloc(attnres_device *dev, size_t bytes, void **ptr)
{
    /* 64-byte alignment: whole cache lines, and any vector width. */
    *ptr = NULL;
    if (posix_memalign(ptr, 64, bytes ? bytes : 64) != 0)
        return ar_device_fail(dev, ATTNRES_ENOMEM, "cannot allocate %zu bytes", bytes);
    return ATTNRES_OK;
}

static void cpu_mem_free(attnres_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

static int cpu_copy(attnres_device *dev, void *dst, const void *src, size_t bytes)
{
    (void)dev;
    memcpy(dst, src, bytes);
    return ATTNRES_OK;
}

/* Host-timed launches, one by one: a CPU launch returns when its work is
 * done, so the wall time around it is the kernel's time. */
static int cpu_time(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                    const ar_op_args *a, int reps, int flush, double *times_us)
{
    (void)flush; /* The CPU's last-level cache is not flushed: see docs/tuning.md. */
    for (int r = 0; r < reps; r++) {
        double t0 = now_us();
        int rc = cpu_launch(dev, k, p, T, a, NULL);
        times_us[r] = now_us() - t0;
        if (rc)
            return rc;
    }
    return ATTNRES_OK;
}

typedef struct copy_job {
    char *dst;
    const char *src;
} copy_job;

static void copy_chunk(void *ctx, int64_t b0, int64_t b1)
{
    copy_job *j = ctx;
    memcpy(j->dst + b0, j->src + b0, (size_t)(b1 - b0));
}

/* Best of multi-threaded memcpy runs over buffers far larger than any
 * cache; read + written bytes per second, as DESIGN §2 counts. The runs
 * span at least half a second: on a shared host a core can stall for a
 * few tens of milliseconds, and a ceiling taken inside one such stall
 * measured one core's copy rate instead of the machine's. */
static int cpu_copy_bandwidth(attnres_device *dev, double *gbps)
{
    cpu_state *st = dev->state;
    const size_t bytes = (size_t)256 << 20;
    char *src = NULL, *dst = NULL;
    if (posix_memalign((void **)&src, 64, bytes) || posix_memalign((void **)&dst, 64, bytes)) {
        free(src);
        return ar_device_fail(dev, ATTNRES_ENOMEM, "cannot allocate copy buffers");
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    copy_job j = {dst, src};
    double best = 1e30, start = now_us();
    for (int r = 0; r < 64 && (r < 8 || now_us() - start < 0.5e6); r++) {
        double t0 = now_us();
        cpu_pool_run(st->pool, copy_chunk, &j, (int64_t)bytes, cpu_pool_workers(st->pool) + 1);
        double t = now_us() - t0;
        if (r > 0 && t < best) /* the first run faults the pages in */
            best = t;
    }
    free(src);
    free(dst);
    *gbps = 2.0 * (double)bytes / (best * 1e3);
    return ATTNRES_OK;
}

/* Every streaming kernel on every thread count, and the FMA peak
 * (cpu_ceilings.c). */
static int cpu_ceilings(attnres_device *dev, ar_ceilings *out)
{
    cpu_state *st = dev->state;
    return cpu_ceilings_measure(dev, st->pool, out);
}

/* One pass of the streaming kernels, timed next to a kernel by the tuner
 * (cpu_ceilings.c). */
static int cpu_stream(attnres_device *dev, void *buf, const ar_stream_pass *pass, double *us)
{
    cpu_state *st = dev->state;
    return cpu_stream_pass(dev, st->pool, buf, pass, us);
}

static void empty_chunk(void *ctx, int64_t t0, int64_t t1)
{
    (void)ctx;
    (void)t0;
    (void)t1;
}

/* A launch's fixed cost on this device: waking every worker for nothing. */
static int cpu_empty_launch(attnres_device *dev, double *us)
{
    cpu_state *st = dev->state;
    enum { REPS = 201 };
    double t[REPS];
    int parts = cpu_pool_workers(st->pool) + 1;
    for (int r = 0; r < REPS; r++) {
        double t0 = now_us();
        cpu_pool_run(st->pool, empty_chunk, NULL, parts, parts);
        t[r] = now_us() - t0;
    }
    for (int i = 1; i < REPS; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *us = t[REPS / 2];
    return ATTNRES_OK;
}

static int cpu_count(void) { return 1; }

const ar_backend ar_cpu_backend = {
    .name = "cpu",
    .count = cpu_count,
    .open = cpu_open,
    .close = cpu_close,
    .compile = cpu_compile,
    .load = cpu_load,
    .check_problem = cpu_check_problem,
    .load_generic = cpu_load_generic,
    .unload = cpu_unload,
    .launch = cpu_launch,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .time = cpu_time,
    .copy_bandwidth = cpu_copy_bandwidth,
    .empty_launch = cpu_empty_launch,
    .ceilings = cpu_ceilings,
    .stream_pass = cpu_stream,
};
