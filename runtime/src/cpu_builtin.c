/*
 * cpu_builtin.c - the table of the CPU backend's built-in kernels per ISA
 * level, and the choice of level at device open (see cpu_builtin.h).
 */
#include "cpu_builtin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"

struct attnres_cpu_mix_args;
struct attnres_cpu_phase1_args;
struct attnres_cpu_phase2_args;
struct attnres_cpu_mix_backward_args;
struct attnres_cpu_phase1_backward_args;
struct attnres_cpu_phase2_backward_args;

/* Generated at build time by `attnres-gen ... builtin` (runtime/CMakeLists). */
#define AR_BUILTIN_DECL(op, dt, level)                                                                  \
    extern void (*const ar_builtin_##op##_##dt##_##level)(const struct attnres_cpu_##op##_args *, int64_t, \
                                                          int64_t);                                     \
    extern const char ar_builtin_##op##_##dt##_##level##_variant[];                                     \
    extern const int ar_builtin_##op##_##dt##_##level##_step

#define AR_BUILTIN_DECL_LEVEL(level)                                                                    \
    AR_BUILTIN_DECL(mix, f32, level);                                                                   \
    AR_BUILTIN_DECL(mix, bf16, level);                                                                  \
    AR_BUILTIN_DECL(mix, f16, level);                                                                   \
    AR_BUILTIN_DECL(phase1, f32, level);                                                                \
    AR_BUILTIN_DECL(phase1, bf16, level);                                                               \
    AR_BUILTIN_DECL(phase1, f16, level);                                                                \
    AR_BUILTIN_DECL(phase2, f32, level);                                                                \
    AR_BUILTIN_DECL(phase2, bf16, level);                                                               \
    AR_BUILTIN_DECL(phase2, f16, level);                                                                \
    AR_BUILTIN_DECL(mix_backward, f32, level);                                                          \
    AR_BUILTIN_DECL(mix_backward, bf16, level);                                                         \
    AR_BUILTIN_DECL(mix_backward, f16, level);                                                          \
    AR_BUILTIN_DECL(phase1_backward, f32, level);                                                       \
    AR_BUILTIN_DECL(phase1_backward, bf16, level);                                                      \
    AR_BUILTIN_DECL(phase1_backward, f16, level);                                                       \
    AR_BUILTIN_DECL(phase2_backward, f32, level);                                                       \
    AR_BUILTIN_DECL(phase2_backward, bf16, level);                                                      \
    AR_BUILTIN_DECL(phase2_backward, f16, level)

typedef void (*any_fn)(void);

/* The ops with built-in kernels: every attnres_op, mix to phase2_backward. */
#define AR_BUILTIN_OPS (ATTNRES_OP_PHASE2_BACKWARD + 1)

typedef struct builtin_kernel {
    any_fn const *entry; /* the generated pointer to the kernel; it holds NULL when the template names none */
    const char *variant;
    const int *step;
} builtin_kernel;

typedef struct builtin_level {
    const char *name;
    int (*supported)(void);
    builtin_kernel k[AR_BUILTIN_OPS][3]; /* [attnres_op][attnres_dtype] */
} builtin_level;

#define AR_BUILTIN_ENTRY(op, dt, level)                                                                 \
    {(any_fn const *)&ar_builtin_##op##_##dt##_##level, ar_builtin_##op##_##dt##_##level##_variant,              \
     &ar_builtin_##op##_##dt##_##level##_step}
#define AR_BUILTIN_OP(op, level)                                                                        \
    {AR_BUILTIN_ENTRY(op, f32, level), AR_BUILTIN_ENTRY(op, bf16, level), AR_BUILTIN_ENTRY(op, f16, level)}
#define AR_BUILTIN_LEVEL(level, check)                                                                  \
    {#level, check,                                                                                     \
     {AR_BUILTIN_OP(mix, level), AR_BUILTIN_OP(phase1, level), AR_BUILTIN_OP(phase2, level),            \
      AR_BUILTIN_OP(mix_backward, level), AR_BUILTIN_OP(phase1_backward, level),                       \
      AR_BUILTIN_OP(phase2_backward, level)}}

/* Widest first; each level's CPU also runs every later one. */
#if defined(__x86_64__) && defined(__GNUC__)
#if defined(ATTNRES_BUILTIN_AVX512BF16)
AR_BUILTIN_DECL_LEVEL(avx512bf16);
#endif
AR_BUILTIN_DECL_LEVEL(avx512);
AR_BUILTIN_DECL_LEVEL(avx2);
AR_BUILTIN_DECL_LEVEL(sse2);

/* The flags runtime/CMakeLists.txt compiles each level with, as CPU
 * features (F16C comes with every AVX2 CPU; compilers cannot test it). */
static int has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#if defined(ATTNRES_BUILTIN_AVX512BF16)
static int has_avx512bf16(void) { return has_avx512() && __builtin_cpu_supports("avx512bf16"); }
#endif
static int has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int always(void) { return 1; } /* SSE2 is x86-64's baseline */

static const builtin_level levels[] = {
#if defined(ATTNRES_BUILTIN_AVX512BF16)
    AR_BUILTIN_LEVEL(avx512bf16, has_avx512bf16),
#endif
    AR_BUILTIN_LEVEL(avx512, has_avx512),
    AR_BUILTIN_LEVEL(avx2, has_avx2),
    AR_BUILTIN_LEVEL(sse2, always),
};
#define AR_NLEVELS ((int)(sizeof levels / sizeof levels[0]))
#elif defined(__aarch64__)
AR_BUILTIN_DECL_LEVEL(neon);
static int always(void) { return 1; } /* NEON is AArch64's baseline */
static const builtin_level levels[] = {AR_BUILTIN_LEVEL(neon, always)};
#define AR_NLEVELS 1
#else
static const builtin_level *const levels = NULL;
#define AR_NLEVELS 0
#endif

const char *ar_cpu_builtin_level_name(int level)
{
    return level >= 0 && level < AR_NLEVELS ? levels[level].name : "scalar";
}

int ar_cpu_builtin_level(char *msg, size_t msg_len)
{
    const char *want = getenv("ATTNRES_CPU_BUILTIN_ISA");
    int cap = 0; /* the widest level allowed */
    if (want && *want) {
        if (strcmp(want, "scalar") == 0)
            return -1;
        cap = -2;
        for (int i = 0; i < AR_NLEVELS; i++)
            if (strcmp(want, levels[i].name) == 0)
                cap = i;
        if (cap == -2) {
            char known[128] = "";
            size_t len = 0;
            for (int i = 0; i < AR_NLEVELS && len < sizeof known; i++)
                len += (size_t)snprintf(known + len, sizeof known - len, "%s, ", levels[i].name);
            snprintf(msg, msg_len, "ATTNRES_CPU_BUILTIN_ISA=%.64s is not an ISA level of this build (%sscalar)", want,
                     known);
            return -2;
        }
    }
    for (int i = cap; i < AR_NLEVELS; i++)
        if (levels[i].supported())
            return i;
    return -1;
}

int ar_cpu_builtin_find(int level, int op, int dtype, int64_t hd, void **entry, const char **variant,
                        const char **level_name)
{
    if (level < 0 || op < 0 || op >= AR_BUILTIN_OPS || dtype < 0 || dtype > 2 || hd < 1)
        return -1;
    for (int i = level; i < AR_NLEVELS; i++) {
        const builtin_kernel *k = &levels[i].k[op][dtype];
        if (!*k->entry || *k->step < 1 || hd % *k->step != 0)
            continue;
        *entry = (void *)*k->entry;
        *variant = k->variant;
        *level_name = levels[i].name;
        return 0;
    }
    return -1;
}

int ar_cpu_builtin_parts(int64_t bytes, int max)
{
    int64_t parts = bytes / AR_CPU_BUILTIN_PART_BYTES;
    if (parts > max)
        parts = max;
    return parts < 1 ? 1 : (int)parts;
}
