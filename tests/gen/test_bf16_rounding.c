/*
 * test_bf16_rounding.c - the CPU templates' bf16 stores round as bf16
 * should: to nearest, ties to even, overflow to Inf, NaN kept NaN (quiet,
 * sign and upper payload kept), on every path the generated code takes.
 *
 * store_row and store_pair each have two implementations
 * (templates/lib/c_storage.lua): the portable integer rounding, and
 * AVX512-BF16's rounding instructions where the compiler targets them,
 * which give the same bits except that they flush subnormals to zero;
 * store_pair of 8 lanes has a third, the integer rounding written for
 * AVX2. This test generates a phase 2 kernel source per vector width
 * (store_row) and a fused mix source per pair width (store_row and
 * store_pair), compiles each into a small driver with the host compiler
 * (once with -march=native and, on x86-64, twice more: without
 * AVX512-BF16, and without AVX2 too), and has the driver compare the
 * stores against a rounding computed here from the neighbouring bf16
 * values, over chosen edge cases and random bit patterns.
 */
#define _GNU_SOURCE /* nftw */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "argen.h"
#include "check.h"
#include "test_scratch.h"

/* The driver: included after the generated source, which defines VEC's
 * vector type vf and store_row. Prints "path native|portable" and one line
 * per mismatch; exits 1 on any. */
static const char driver_text[] =
    "#include <stdio.h>\n"
    "#include <math.h>\n"
    "#if (VEC == 16 && defined(__AVX512BF16__)) || \\\n"
    "    (VEC == 8 && defined(__AVX512BF16__) && defined(__AVX512VL__))\n"
    "#define NATIVE 1\n"
    "#else\n"
    "#define NATIVE 0\n"
    "#endif\n"
    "/* store_pair's AVX2 rounding (8 lanes, without AVX512-BF16). */\n"
    "#if !NATIVE && VEC == 8 && PAIR && defined(__AVX2__)\n"
    "#define AVX2_PAIR 1\n"
    "#else\n"
    "#define AVX2_PAIR 0\n"
    "#endif\n"
    "static float from_bits(uint32_t w) { float f; memcpy(&f, &w, 4); return f; }\n"
    "/* The bf16 nearest to w, ties to the even one, from the two bf16\n"
    " * neighbours around it (compared in double, exactly). */\n"
    "static uint16_t expected(uint32_t w)\n"
    "{\n"
    "    const float f = from_bits(w);\n"
    "    if (isnan(f))\n"
    "        return (uint16_t)((w >> 16) | 0x40u);\n"
    "    if (NATIVE && fpclassify(f) == FP_SUBNORMAL)\n"
    "        return (uint16_t)((w >> 16) & 0x8000u);\n"
    "    const uint32_t lo = w & 0xffff0000u, hi = lo + 0x10000u;\n"
    "    if (lo == w || isinf(f))\n"
    "        return (uint16_t)(lo >> 16);\n"
    "    const double below = fabs((double)f - (double)from_bits(lo));\n"
    "    /* hi may step past the largest finite value into Inf: the\n"
    "     * rounding boundary is then the one an extra exponent would give. */\n"
    "    const double above = isinf(from_bits(hi)) ? ldexp(1.0, 128) - fabs((double)f)\n"
    "                                              : fabs((double)from_bits(hi) - (double)f);\n"
    "    if (below < above || (below == above && ((lo >> 16) & 1u) == 0))\n"
    "        return (uint16_t)(lo >> 16);\n"
    "    return (uint16_t)(hi >> 16);\n"
    "}\n"
    "int main(void)\n"
    "{\n"
    "    static const uint32_t edges[] = {\n"
    "        0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu, 0xbf808000u,\n"
    "        0xbf818000u, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0xff7f8000u, 0x7f800000u,\n"
    "        0xff800000u, 0x7fc00000u, 0x7fc00001u, 0x7f800001u, 0xff800001u, 0x7fffffffu,\n"
    "        0x00000000u, 0x80000000u, 0x00000001u, 0x007fffffu, 0x807fffffu, 0x00008000u,\n"
    "        0x00800000u, 0x00808000u, 0x00818000u, 0x3effffffu, 0x4b7f8000u, 0x4b7fc000u,\n"
    "    };\n"
    "    const int n_edges = (int)(sizeof edges / sizeof edges[0]);\n"
    "    int bad = 0, checked = 0;\n"
    "    uint32_t state = 12345u;\n"
    "    printf(\"path %s\\n\", NATIVE ? \"native\" : AVX2_PAIR ? \"avx2\" : \"portable\");\n"
    "    for (int round = 0; round < n_edges + 20000; round++) {\n"
    "        uint32_t w[VEC];\n"
    "        for (int i = 0; i < VEC; i++) {\n"
    "            state = state * 1664525u + 1013904223u;\n"
    "            w[i] = round < n_edges ? edges[(round + i) % n_edges] : state;\n"
    "        }\n"
    "        vf x;\n"
    "        memcpy(&x, w, sizeof x);\n"
    "        uint16_t got[VEC];\n"
    "        store_row(got, x);\n"
    "        for (int i = 0; i < VEC; i++, checked++)\n"
    "            if (got[i] != expected(w[i]) && bad++ < 20)\n"
    "                printf(\"0x%08x: got 0x%04x, expected 0x%04x\\n\", w[i], got[i], expected(w[i]));\n"
    "#if PAIR\n"
    "        /* store_pair interleaves: element 2i from lo, 2i + 1 from hi. */\n"
    "        uint32_t w2[VEC];\n"
    "        for (int i = 0; i < VEC; i++) {\n"
    "            state = state * 1664525u + 1013904223u;\n"
    "            w2[i] = round < n_edges ? edges[(round + 7 * i + 3) % n_edges] : state;\n"
    "        }\n"
    "        vf hi;\n"
    "        memcpy(&hi, w2, sizeof hi);\n"
    "        uint16_t pair[2 * VEC];\n"
    "        store_pair(pair, x, hi);\n"
    "        for (int i = 0; i < 2 * VEC; i++, checked++) {\n"
    "            const uint32_t in = i % 2 ? w2[i / 2] : w[i / 2];\n"
    "            if (pair[i] != expected(in) && bad++ < 20)\n"
    "                printf(\"pair 0x%08x: got 0x%04x, expected 0x%04x\\n\", in, pair[i], expected(in));\n"
    "        }\n"
    "#endif\n"
    "    }\n"
    "    printf(\"%d of %d value(s) rounded wrongly\\n\", bad, checked);\n"
    "    return bad != 0;\n"
    "}\n";

static char work_dir[] = "/tmp/attnres_bf16_rounding_XXXXXX";

static int write_file(const char *path, const char *a, const char *b)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    int ok = fputs(a, f) >= 0 && (!b || fputs(b, f) >= 0);
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Runs `command`, echoing its output; returns its exit status (or -1) and
 * stores in path (when given) the store path the driver reported. */
static int run(const char *command, char path[16])
{
    FILE *p = popen(command, "r");
    if (!p)
        return -1;
    char line[256];
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        if (path && strncmp(line, "path ", 5) == 0)
            snprintf(path, 16, "%.*s", (int)strcspn(line + 5, "\n"), line + 5);
    }
    int status = pclose(p);
    return status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Generates `id` (a bf16 variant of `vec` lanes; `pair` where its source
 * has store_pair), builds the driver with `flags` and runs it; path says
 * which store path it took ("native", "avx2" or "portable"). */
static void check_variant(argen *g, const char *id, int vec, int pair, const char *flags, char path[16])
{
    char *source = NULL, *kernel = NULL, *params = NULL;
    if (argen_emit(g, id, &source, &kernel, &params) != 0)
        fprintf(stderr, "%s: %s\n", id, argen_errmsg(g));
    free(params);
    REQUIRE(source != NULL);
    char src_path[512], exe_path[512], command[2048];
    snprintf(src_path, sizeof src_path, "%s/%s.c", work_dir, id);
    snprintf(exe_path, sizeof exe_path, "%s/%s", work_dir, id);
    int wrote = write_file(src_path, source, driver_text);
    free(source);
    free(kernel);
    REQUIRE(wrote == 0);
    snprintf(command, sizeof command, "%s -O2 %s -std=gnu11 -DVEC=%d -DPAIR=%d -o '%s' '%s' -lm 2>&1", HOST_CC, flags,
             vec, pair, exe_path, src_path);
    printf("%s\n", command);
    CHECK(run(command, NULL) == 0);
    snprintf(command, sizeof command, "'%s' 2>&1", exe_path);
    CHECK(run(command, path) == 0);
}

static void test_bf16_stores_round_to_nearest_even_on_every_path(void)
{
    static const struct {
        const char *template_name, *id;
        int vec, pair;
    } variants[] = {
        {"cpu/phase2", "phase2_c_bf16_v16_u1_p0_t1", 16, 0},
        {"cpu/phase2", "phase2_c_bf16_v8_u1_p0_t1", 8, 0},
        {"cpu/phase2", "phase2_c_bf16_v1_u1_p0_t1", 1, 0},
        {"cpu/mix_fused", "mix_c_bf16_fused_v16_g4_pn_dfma_sc_t1", 16, 1},
        {"cpu/mix_fused", "mix_c_bf16_fused_v8_g4_pn_dfma_sc_t1", 8, 1},
    };
    int native_paths = 0;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char msg[1024];
        argen *g = NULL;
        REQUIRE(argen_open(TEMPLATE_DIR, variants[i].template_name, &g, msg, sizeof msg) == 0);
        char path[16] = "";
        check_variant(g, variants[i].id, variants[i].vec, variants[i].pair, "-march=native", path);
        native_paths += strcmp(path, "native") == 0;
#if defined(__x86_64__)
        /* The integer rounding, as a CPU without AVX512-BF16 runs it: with
         * AVX2 (store_pair's own, at 8 lanes) and without. */
        strcpy(path, "");
        check_variant(g, variants[i].id, variants[i].vec, variants[i].pair, "-march=native -mno-avx512bf16", path);
        CHECK(strcmp(path, "native") != 0 && path[0] != '\0');
        strcpy(path, "");
        check_variant(g, variants[i].id, variants[i].vec, variants[i].pair,
                      "-march=native -mno-avx512bf16 -mno-avx2", path);
        CHECK(strcmp(path, "portable") == 0);
#endif
        argen_close(g);
    }
    printf("%d variant(s) took AVX512-BF16's rounding on this host\n", native_paths);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (!mkdtemp(work_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    RUN_CASE(test_bf16_stores_round_to_nearest_even_on_every_path);
    scratch_remove(work_dir);
    CHECK_EXIT();
}
