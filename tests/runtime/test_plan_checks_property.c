/*
 * test_plan_checks_property.c - the plan-time and run-time checks, at
 * random around every limit and overflow boundary: the library either
 * refuses with EINVAL (EMISMATCH for a stride below d) or computes what the
 * fp64 reference computes, and writes nothing outside its outputs.
 *
 * The cases: view extents and overlap (views.h) against exact models;
 * plans around the limits of attnres.h and the CPU's; runs of mix, phase 1
 * and phase 2 with random T, strides, offsets and aliasing.
 *
 * Each case draws its trials from a fixed seed; trial i draws from the
 * seed and i alone, so that `--case CASE/i` reruns one trial. The test's
 * own model says which trials must be refused: exact 128-bit arithmetic
 * for extents, a byte-by-byte model for overlap, the formulas of attnres.h
 * for the limits; the library must agree with it both ways.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "test_device.h"
#include "views.h"

static attnres_device *cpu;

/* ---- deterministic draws ---------------------------------------------- */

static uint64_t rng_state;

static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int64_t below(int64_t n) { return n > 0 ? (int64_t)(next_u64() % (uint64_t)n) : 0; }

static int64_t pick(const int64_t *v, size_t n) { return v[below((int64_t)n)]; }
#define PICK(...) pick((const int64_t[]){__VA_ARGS__}, sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

/* Starts trial i of a case: its unit name, and its draws from seed and i. */
static int trial(uint64_t seed, int i)
{
    char unit[32];
    snprintf(unit, sizeof unit, "%d", i);
    if (!check_unit(unit))
        return 0;
    rng_state = seed * 0x100000001b3ull + (uint64_t)i;
    (void)next_u64();
    return 1;
}

/* ---- views: extents ---------------------------------------------------- */

/* The exact model of ar_view_make: the extent in bytes and the last byte's
 * address, in 128 bits. */
static int model_extent_ok(uintptr_t ptr, int64_t rows, int64_t stride, int64_t width, size_t es)
{
    if (rows < 1 || width < 1 || (rows > 1 && stride < width))
        return 0;
    if ((__int128)stride * (__int128)es > INT64_MAX || (__int128)stride * (__int128)es < INT64_MIN)
        return 0; /* the stride in bytes, which kernels compute even for one row */
    const __int128 s = rows == 1 ? width : stride;
    const __int128 elems = (__int128)(rows - 1) * s + width;
    if (elems > INT64_MAX)
        return 0;
    const __int128 bytes = elems * (__int128)es;
    return bytes <= PTRDIFF_MAX && (__int128)ptr + bytes - 1 <= (__int128)UINTPTR_MAX;
}

/* a + b, held inside int64_t: the draws must not overflow themselves. */
static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

/* A value at or next to a boundary of v. */
static int64_t near(int64_t v)
{
    const int64_t r = sat_add(v, below(5) - 2);
    return r < 1 ? 1 : r;
}

static void test_view_extents_match_exact_arithmetic(void)
{
    for (int i = 0; i < 20000; i++) {
        if (!trial(1, i))
            continue;
        const size_t es = (size_t)PICK(2, 4);
        const int64_t width = PICK(1, 3, 64, 7168, near(INT64_MAX / 4), INT64_MAX);
        const int64_t rows = PICK(1, 2, 3, 4096, near(INT64_MAX / 2), INT64_MAX, near((int64_t)1 << 32));
        int64_t stride;
        switch (below(5)) {
        case 0: stride = width; break;
        case 1: stride = sat_add(width, below(100)); break;
        case 2: stride = width - 1 - below(3); break;
        case 3: /* the largest stride whose extent still fits in bytes, give or take */
            stride = rows > 1 ? near((PTRDIFF_MAX / (int64_t)es - width) / (rows - 1)) : width;
            break;
        default: stride = PICK(INT64_MAX, INT64_MAX / 2, INT64_MAX / 4 + 1, (int64_t)1 << 61, -1, INT64_MIN); break;
        }
        const uintptr_t ptr = (uintptr_t)PICK(64, 4096, (int64_t)1 << 46, INT64_MAX) +
                              (below(2) ? (uintptr_t)INT64_MAX - (uintptr_t)below(1 << 20) : 0);
        ar_view v;
        const int got = ar_view_make(&v, (const void *)ptr, rows, stride, width, es) == 0;
        const int want = model_extent_ok(ptr, rows, stride, width, es);
        CHECK(got == want);
        if (got != want)
            fprintf(stderr, "  ptr %#llx rows %lld stride %lld width %lld es %zu: library %d, model %d\n",
                    (unsigned long long)ptr, (long long)rows, (long long)stride, (long long)width, es, got, want);
        if (got && want)
            CHECK(v.extent == (uint64_t)(((rows == 1 ? 0 : (__int128)(rows - 1) * stride) + width) * (__int128)es));
    }
}

/* ---- views: overlap ---------------------------------------------------- */

/* Marks the bytes a view covers in a bitmap of `size` bytes. */
static void mark(unsigned char *bits, const ar_view *v, uintptr_t base)
{
    for (uint64_t r = 0; r < v->rows; r++)
        for (uint64_t b = 0; b < v->width; b++) {
            const uint64_t at = v->start - base + r * v->stride + b;
            bits[at / 8] |= (unsigned char)(1u << (at % 8));
        }
}

/* The model of ar_views_overlap: shared bytes where the two have one stride
 * and row count, else whole ranges. */
static int model_overlap(const ar_view *a, const ar_view *b, uintptr_t base, size_t size)
{
    if (a->rows != b->rows || a->rows == 1 || a->stride != b->stride)
        return a->start < b->start + b->extent && b->start < a->start + a->extent;
    unsigned char x[size / 8 + 1], y[size / 8 + 1];
    memset(x, 0, sizeof x);
    memset(y, 0, sizeof y);
    mark(x, a, base);
    mark(y, b, base);
    for (size_t k = 0; k < sizeof x; k++)
        if (x[k] & y[k])
            return 1;
    return 0;
}

static void test_view_overlap_matches_byte_model(void)
{
    enum { SPAN = 4096 };
    static char arena[SPAN];
    const uintptr_t base = (uintptr_t)arena;
    for (int i = 0; i < 20000; i++) {
        if (!trial(2, i))
            continue;
        const int64_t rows = PICK(1, 2, 3, 5, 8);
        const size_t es = (size_t)PICK(1, 2, 4);
        ar_view a, b;
        const int64_t wa = 1 + below(12), wb = PICK(wa, 1 + below(12));
        const int64_t sa = PICK(wa, wa + below(20), 2 * wa, wa + wb);
        const int64_t sb = below(3) ? sa : PICK(wb, wb + below(20));
        const int64_t oa = below(200), ob = PICK(oa, oa + below(3), oa + wa, oa + sa - wb, below(400), oa + sa);
        if (ob < 0)
            continue;
        REQUIRE(ar_view_make(&a, arena + oa, rows, sa, wa, es) == 0 && a.start + a.extent <= base + SPAN);
        REQUIRE(ar_view_make(&b, arena + ob, rows, sb < wb ? wb : sb, wb, es) == 0 &&
                b.start + b.extent <= base + SPAN);
        const int got = ar_views_overlap(&a, &b), want = model_overlap(&a, &b, base, SPAN);
        CHECK(got == want && ar_views_overlap(&b, &a) == got);
        if (got != want)
            fprintf(stderr, "  a at %lld rows %lld stride %lld width %lld, b at %lld stride %lld width %lld (es %zu):"
                            " library %d, model %d\n",
                    (long long)oa, (long long)rows, (long long)sa, (long long)wa, (long long)ob, (long long)sb,
                    (long long)wb, es, got, want);
    }
}

/* ---- plans at the limits ----------------------------------------------- */

/* The limits of attnres.h, and the CPU's: whether a plan must be made. */
static int model_plan_ok(const attnres_problem *p)
{
    if (p->d < 1 || p->d > ATTNRES_MAX_D || p->n < 1 || p->n > ATTNRES_MAX_N || p->heads < 1 ||
        p->heads > ATTNRES_MAX_HEADS || p->d % p->heads)
        return 0;
    if (p->op == ATTNRES_OP_PHASE1 && (p->s < 1 || p->s > ATTNRES_MAX_S))
        return 0;
    if (p->op != ATTNRES_OP_PHASE2 && p->n > 256)
        return 0;
    const int64_t d = p->d, n = p->n, h = p->heads, s = p->s;
    if (p->op == ATTNRES_OP_PHASE1)
        return n * s * h <= 32768 && 4 * (n * s * h + 4 * h + d) + 16 * n <= ATTNRES_CPU_STACK_MAX;
    return 16 * d + 8 * n * h + 16 * h + 192 * n <= ATTNRES_CPU_STACK_MAX;
}

/* One draw of every field near one of its limits. */
static void draw_limit_problem(attnres_problem *p)
{
    const attnres_op op = (attnres_op)below(3);
    int64_t d = PICK(1, 64, near(131072), near(262144), 524288, near(ATTNRES_MAX_D), ATTNRES_MAX_D + 1);
    int64_t heads = PICK(1, 2, near(1024), near(65536), d);
    if (heads < 1 || heads > ATTNRES_MAX_HEADS + 1)
        heads = 1;
    d = d / heads * heads;
    if (d < 1)
        d = heads;
    if (below(4) == 0)
        d = heads = PICK(near(65536), 131072, 524288, ATTNRES_MAX_HEADS, ATTNRES_MAX_HEADS + 1);
    attnres_problem_init(p, ATTNRES_DTYPE_F32, d, (int32_t)PICK(1, 2, near(256), near(ATTNRES_MAX_N)));
    p->heads = (int32_t)heads;
    p->op = op;
    if (op == ATTNRES_OP_PHASE1)
        p->s = (int32_t)PICK(1, 2, near(64), near(4096), ATTNRES_MAX_S + 1);
    if (op == ATTNRES_OP_PHASE2)
        p->n = 1;
}

static double rand_unit(void) { return (double)(next_u64() >> 11) / (double)(1ull << 53) * 2.0 - 1.0; }

static int close_enough(double got, double want) { return fabs(got - want) <= 2e-3 * (1.0 + fabs(want)); }

/* Runs an accepted plan on one token of random data and compares it with
 * the fp64 reference. */
static void run_one_token(attnres_plan *plan, const attnres_problem *p)
{
    const int64_t d = p->d;
    const int n = p->n, S = p->op == ATTNRES_OP_PHASE1 ? p->s : 1;
    if (d * (n + 2 * S + 2) > ((int64_t)1 << 22))
        return; /* accepted, but more memory than a fast test should take */
    float *f = malloc(sizeof(float) * (size_t)(d * (n + 2 * S + 2)));
    double *x = malloc(sizeof(double) * (size_t)(d * (n + 2 * S + 2) + (int64_t)S * p->heads));
    REQUIRE(f && x);
    const int64_t total = d * (n + S + 1);
    for (int64_t k = 0; k < total; k++)
        x[k] = (double)(f[k] = (float)rand_unit());
    const void *src[n];
    const double *dsrc[n];
    for (int i = 0; i < n; i++) {
        src[i] = f + i * d;
        dsrc[i] = x + i * d;
    }
    float *q = f + n * d, *out = f + total;   /* S queries, then S outputs */
    double *dq = x + n * d, *dout = x + total, *dlse = x + total + S * d;
    int st;
    if (p->op == ATTNRES_OP_MIX) {
        attnres_mix_args a;
        attnres_mix_args_init(&a);
        a.sources = src;
        a.query = q;
        a.out = out;
        st = attnres_run_mix(plan, 1, &a, NULL);
        CHECK(attnres_reference_mix(p, 1, dsrc, dq, 1, 1e-6, NULL, 1, NULL, 1e-6, dout, NULL) == ATTNRES_OK);
    } else if (p->op == ATTNRES_OP_PHASE1) {
        void *o1[S];
        float *lse = malloc(sizeof(float) * (size_t)S * (size_t)p->heads), *lses[S];
        REQUIRE(lse);
        for (int j = 0; j < S; j++) {
            o1[j] = out + j * d;
            lses[j] = lse + (int64_t)j * p->heads;
        }
        attnres_phase1_args a;
        attnres_phase1_args_init(&a);
        a.sources = src;
        a.queries = q;
        a.o1 = o1;
        a.lse = lses;
        st = attnres_run_phase1(plan, 1, &a, NULL);
        CHECK(attnres_reference_phase1(p, 1, dsrc, dq, 1, 1e-6, dout, dlse) == ATTNRES_OK);
        int bad = 0;
        for (int64_t k = 0; k < (int64_t)S * p->heads && !bad; k++)
            bad = !close_enough(lse[k], dlse[k]);
        CHECK(!bad);
        free(lse);
    } else {
        /* phase 2 reads o1 (source 0), lse (zeros), partial (the query
         * block's second half is not needed: use the output row). */
        float *lse = calloc((size_t)p->heads, sizeof(float));
        double *dl = calloc((size_t)p->heads, sizeof(double));
        float *b = out + d; /* the row after out */
        double *db = dout + d;
        for (int64_t k = 0; k < d; k++)
            db[k] = b[k] = (float)rand_unit();
        attnres_phase2_args a;
        attnres_phase2_args_init(&a);
        a.o1 = src[0];
        a.lse = lse;
        a.partial = b;
        a.query = q;
        a.out = out;
        st = lse && dl ? attnres_run_phase2(plan, 1, &a, NULL) : -1;
        CHECK(attnres_reference_phase2(p, 1, dsrc[0], dl, db, NULL, dq, 1, 1e-6, NULL, 1e-6, dout, NULL) ==
              ATTNRES_OK);
        free(lse);
        free(dl);
    }
    CHECK(st == ATTNRES_OK);
    if (st != ATTNRES_OK)
        fprintf(stderr, "  run: %s\n", attnres_plan_errmsg(plan));
    int bad = 0;
    for (int64_t k = 0; k < S * d && !bad; k++)
        bad = !close_enough(out[k], dout[k]);
    CHECK(!bad);
    free(f);
    free(x);
}

static void test_plans_at_the_limits_refuse_or_match_reference(void)
{
    int made = 0, refused = 0;
    for (int i = 0; i < 400; i++) {
        if (!trial(3, i))
            continue;
        attnres_problem p;
        draw_limit_problem(&p);
        attnres_plan *plan = NULL;
        char msg[512] = "";
        const int st = attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg);
        const int want = model_plan_ok(&p);
        CHECK(st == (want ? ATTNRES_OK : ATTNRES_EINVAL));
        if (st != (want ? ATTNRES_OK : ATTNRES_EINVAL))
            fprintf(stderr, "  op %d d %lld N %d H %d S %d: status %d (%s), model %s\n", (int)p.op, (long long)p.d,
                    p.n, p.heads, p.s, st, msg, want ? "accepts" : "refuses");
        if (st == ATTNRES_OK)
            run_one_token(plan, &p);
        made += st == ATTNRES_OK;
        refused += st == ATTNRES_EINVAL;
        attnres_plan_destroy(plan);
    }
    printf("  %d plans made and run, %d refused\n", made, refused);
}

/* ---- runs: strides, offsets, T ---------------------------------------- */

/* One argument of a run as a trial lays it out in the arena. */
typedef struct layout {
    int64_t offset; /* elements into the arena */
    int64_t stride; /* as passed: 0 means width */
    int64_t width;
    int rows_t;     /* 1: T rows; 0: one row (a vector) */
    int output;     /* written by the run */
    int used;       /* read or written by the problem */
} layout;

enum { ARENA = 1 << 16, MAXV = 12, MAXS = 70 };

static int64_t eff(const layout *l) { return l->stride ? l->stride : l->width; }

/* The view of l as the library must see it; 0 when its extent must be
 * refused (the exact model above). */
static int model_view(const layout *l, float *arena, int64_t T, ar_view *v)
{
    const int64_t rows = l->rows_t ? T : 1, stride = l->rows_t ? eff(l) : l->width;
    if (!model_extent_ok((uintptr_t)(arena + l->offset), rows, stride, l->width, 4))
        return 0;
    return ar_view_make(v, arena + l->offset, rows, stride, l->width, 4) == 0;
}

/* Draws every strided view's stride (mostly valid: the width, padded,
 * doubled for interleaving; now and then short, negative, or past every
 * extent) and every view's place (apart, or onto another view: the same
 * place, a few elements off, its next row). */
static void draw_layout(layout *lay, int count, int64_t T, int huge_t)
{
    for (int k = 0; k < count; k++) {
        const int64_t w = lay[k].width, r = below(40);
        lay[k].stride = 0;
        if (!lay[k].rows_t || r < 12)
            continue;
        if (r < 20)
            lay[k].stride = w;
        else if (r < 28)
            lay[k].stride = w + below(9);
        else if (r < 34)
            lay[k].stride = 2 * w;
        else if (r < 35)
            lay[k].stride = w > 1 ? w - 1 : -1;
        else if (r < 36)
            lay[k].stride = -PICK(1, w, INT64_MAX);
        else
            lay[k].stride = PICK(INT64_MAX, INT64_MAX / 2, INT64_MAX / 4 + 1, (int64_t)1 << 61,
                                 near(PTRDIFF_MAX / 4 / (T > 1 ? T - 1 : 1)) + w);
    }
    int64_t at = 64;
    for (int k = 0; k < count; k++) {
        const int64_t s = eff(&lay[k]) > 0 && eff(&lay[k]) < ((int64_t)1 << 20) ? eff(&lay[k]) : lay[k].width;
        const int64_t rows = lay[k].rows_t && !huge_t ? T : 1;
        if (k > 0 && below(count > 16 ? 4 * count : 4) == 0) { /* about once a trial with many views */
            const layout *o = &lay[below(k)];
            const int64_t next_row = eff(o) > 0 && eff(o) < ((int64_t)1 << 20) ? eff(o) : o->width;
            lay[k].offset = o->offset + PICK(0, below(3), o->width, -below(3), next_row);
            if (lay[k].offset < 0)
                lay[k].offset = 0;
        } else {
            lay[k].offset = at;
            at += s * rows + 16;
        }
    }
}

/* What the library must answer: EMISMATCH for a stride below its view's
 * width (checked whether or not the problem uses the view), EINVAL for an
 * extent that overflows or an output that shares a byte with another view
 * (but the pair `inplace`, outputs first, when they are the same view), OK
 * otherwise; -1 when a valid view does not fit the arena (not drawn). */
static int model_verdict(const layout *lay, int count, float *arena, int64_t T, int inplace_out, int inplace_in,
                         int outputs_by_range)
{
    ar_view mv[count];
    for (int k = 0; k < count; k++)
        if (lay[k].rows_t && lay[k].stride && lay[k].stride < lay[k].width)
            return ATTNRES_EMISMATCH;
    int extent_bad = 0, fits = 1;
    for (int k = 0; k < count; k++) {
        if (!lay[k].used)
            continue;
        if (!model_view(&lay[k], arena, T, &mv[k]))
            extent_bad = 1;
        else if (mv[k].start + mv[k].extent > (uintptr_t)(arena + ARENA))
            fits = 0;
    }
    if (extent_bad)
        return ATTNRES_EINVAL;
    if (!fits)
        return -1;
    for (int a = 0; a < count; a++)
        for (int b = 0; b < count; b++) {
            if (a == b || !lay[a].used || !lay[b].used || !lay[a].output)
                continue;
            if (a == inplace_out && b == inplace_in && ar_views_same(&mv[a], &mv[b]))
                continue;
            if (outputs_by_range && lay[b].output) {
                if (mv[a].start < mv[b].start + mv[b].extent && mv[b].start < mv[a].start + mv[a].extent)
                    return ATTNRES_EINVAL;
            } else if (model_overlap(&mv[a], &mv[b], (uintptr_t)arena, sizeof(float) * ARENA))
                return ATTNRES_EINVAL;
        }
    return ATTNRES_OK;
}

/* Copies view l as it was (from `before`) into T contiguous rows. */
static void gather(const layout *l, const float *before, int64_t T, double *to)
{
    const int64_t rows = l->rows_t ? T : 1;
    for (int64_t t = 0; t < rows; t++)
        for (int64_t e = 0; e < l->width; e++)
            to[t * l->width + e] = l->used ? before[l->offset + t * eff(l) + e] : 0.0;
}

/* Whether output view l now holds `want` (T contiguous rows). */
static int matches(const layout *l, const float *arena, int64_t T, const double *want)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < l->width; e++)
            if (!close_enough(arena[l->offset + t * eff(l) + e], want[t * l->width + e]))
                return 0;
    return 1;
}

/* Whether anything outside the used output views changed. */
static int stray_writes(const layout *lay, int count, const float *arena, const float *before, int64_t T)
{
    unsigned char *written = calloc(ARENA, 1);
    if (!written)
        return 1;
    for (int k = 0; k < count; k++)
        if (lay[k].used && lay[k].output)
            for (int64_t t = 0; t < (lay[k].rows_t ? T : 1); t++)
                memset(written + lay[k].offset + t * eff(&lay[k]), 1, (size_t)lay[k].width);
    int stray = 0;
    for (int64_t k = 0; k < ARENA && !stray; k++)
        stray = !written[k] && memcmp(&arena[k], &before[k], sizeof(float)) != 0;
    free(written);
    return stray;
}

/* The tally of a case's trials. */
typedef struct tally {
    int ran, refused_short, refused_einval, not_drawn, ran_by_range;
} tally;

/* Checks a run's status against the model's verdict; 1 when the run went
 * ahead and its outputs are to be compared. */
static int judge(int st, int want, const float *arena, const float *before, attnres_plan *plan, tally *tl,
                 const char *what)
{
    CHECK(st == want);
    if (st != want)
        fprintf(stderr, "  %s: status %d (%s), model %d\n", what, st, attnres_plan_errmsg(plan), want);
    if (st == ATTNRES_OK)
        return 1;
    if (st == ATTNRES_EMISMATCH)
        tl->refused_short++;
    else
        tl->refused_einval++;
    CHECK(memcmp(arena, before, sizeof(float) * ARENA) == 0); /* refused: nothing written */
    return 0;
}

/* Counts a run that went ahead, checking that it wrote nothing outside
 * its used output views. */
static void ran_clean(const layout *lay, int count, const float *arena, const float *before, int64_t T, tally *tl)
{
    CHECK(!stray_writes(lay, count, arena, before, T));
    tl->ran++;
}

/* Prints a case's tally; with sites, how many runs had more than 64 of
 * them (phase 1 compares those outputs by whole ranges). */
static void report(const tally *tl, int sites)
{
    char by_range[64] = "";
    if (sites)
        snprintf(by_range, sizeof by_range, " (%d with more than 64 sites)", tl->ran_by_range);
    printf("  %d runs matched the reference%s; refused: %d short strides, %d extents or overlaps; %d not drawn\n",
           tl->ran, by_range, tl->refused_short, tl->refused_einval, tl->not_drawn);
}

/* Runs trials 0 to count - 1 of the case seeded `seed` (those that
 * --case selects) through one, on one arena, and reports the tally; sites
 * as report's. */
static void run_trials(uint64_t seed, int count, int sites, void (*one)(float *arena, float *before, tally *tl))
{
    float *arena = malloc(sizeof(float) * ARENA), *before = malloc(sizeof(float) * ARENA);
    REQUIRE(arena && before);
    tally tl = {0};
    for (int i = 0; i < count; i++)
        if (trial(seed, i))
            one(arena, before, &tl);
    free(arena);
    free(before);
    report(&tl, sites);
}

/* A plan of p for one trial whose layout the model judged `want`, and
 * the arena filled afresh with `before` a copy of it. NULL when there is
 * no run: a layout that does not fit the arena (counted as not drawn) or a
 * plan refused (a failed check). */
static attnres_plan *trial_plan(const attnres_problem *p, int want, float *arena, float *before, tally *tl)
{
    if (want < 0) {
        tl->not_drawn++;
        return NULL;
    }
    attnres_plan *plan = NULL;
    const int st = attnres_plan_create(cpu, NULL, p, 0, &plan, NULL, 0);
    CHECK(st == ATTNRES_OK);
    if (st != ATTNRES_OK)
        return NULL;
    for (int64_t k = 0; k < ARENA; k++)
        arena[k] = (float)rand_unit();
    memcpy(before, arena, sizeof(float) * ARENA);
    return plan;
}

/* The first n views of lay as a run's sources: pointers into the arena
 * and their strides. */
static void source_views(const layout *lay, int n, float *arena, const void **src, int64_t *strides)
{
    for (int k = 0; k < n; k++) {
        src[k] = arena + lay[k].offset;
        strides[k] = lay[k].stride;
    }
}

/* The first n views of lay as they were, each gathered into T rows of ds
 * (one after the other), and dsrc pointing at each. */
static void gather_sources(const layout *lay, int n, const float *before, int64_t T, double *ds,
                           const double **dsrc)
{
    for (int k = 0; k < n; k++) {
        dsrc[k] = ds;
        gather(&lay[k], before, T, ds);
        ds += T * lay[k].width;
    }
}

/* A head count that divides d. */
static int32_t draw_heads(int64_t d)
{
    const int32_t heads = (int32_t)PICK(1, 2, 4);
    return d % heads ? 1 : heads;
}

static int64_t draw_t(int *huge_t)
{
    *huge_t = below(10) == 0;
    return *huge_t ? PICK(INT64_MAX, INT64_MAX / 2, (int64_t)1 << 62, near(PTRDIFF_MAX / 4 / 64 + 1))
                   : PICK(1, 2, 3, 7, 16);
}

/* One trial of the mix case: a drawn problem and layout, run and judged. */
static void mix_trial(float *arena, float *before, tally *tl)
{
    const int64_t d = PICK(1, 4, 16, 24, 64);
    const int32_t heads = draw_heads(d);
    const int n = (int)PICK(1, 2, 3, 5);
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, n);
    p.heads = heads;
    p.form = below(2) ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = (int32_t)below(2);
    int huge_t;
    const int64_t T = draw_t(&huge_t);
    /* n sources, query, partial, out_gain, out, normed. */
    layout lay[MAXV];
    int count = 0;
    for (int k = 0; k < n; k++)
        lay[count++] = (layout){0, 0, d, 1, 0, 1};
    const int iq = count, ip = count + 1, ig = count + 2, io = count + 3, in = count + 4;
    lay[count++] = (layout){0, 0, d, 0, 0, 1};
    lay[count++] = (layout){0, 0, d, 1, 0, p.form == ATTNRES_FORM_ADDITIVE};
    lay[count++] = (layout){0, 0, d, 0, 0, p.epilogue};
    lay[count++] = (layout){0, 0, d, 1, 1, 1};
    lay[count++] = (layout){0, 0, d, 1, 1, p.epilogue};
    draw_layout(lay, count, T, huge_t);
    const int want = model_verdict(lay, count, arena, T, io, ip, 0);
    attnres_plan *plan = trial_plan(&p, want, arena, before, tl);
    if (!plan)
        return;
    const void *src[n];
    int64_t strides[n];
    source_views(lay, n, arena, src, strides);
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = src;
    a.source_strides = strides;
    a.query = arena + lay[iq].offset;
    a.partial = arena + lay[ip].offset;
    a.partial_stride = lay[ip].stride;
    a.out_gain = arena + lay[ig].offset;
    a.out = arena + lay[io].offset;
    a.out_stride = lay[io].stride;
    a.normed = arena + lay[in].offset;
    a.normed_stride = lay[in].stride;
    char what[160];
    snprintf(what, sizeof what, "mix d %lld N %d H %d T %lld form %d epilogue %d", (long long)d, n, heads,
             (long long)T, (int)p.form, p.epilogue);
    if (judge(attnres_run_mix(plan, T, &a, NULL), want, arena, before, plan, tl, what)) {
        double *ds = malloc(sizeof(double) * (size_t)(T * d * (n + 3) + 2 * d));
        REQUIRE(ds);
        const double *dsrc[n];
        gather_sources(lay, n, before, T, ds, dsrc);
        double *dpart = ds + n * T * d, *dout = dpart + T * d, *dnorm = dout + T * d, *dq = dnorm + T * d,
               *dg = dq + d;
        gather(&lay[ip], before, T, dpart);
        gather(&lay[iq], before, T, dq);
        gather(&lay[ig], before, T, dg);
        CHECK(attnres_reference_mix(&p, T, dsrc, dq, 1, 1e-6, dpart, 1, dg, 1e-6, dout, dnorm) ==
              ATTNRES_OK);
        CHECK(matches(&lay[io], arena, T, dout));
        CHECK(!p.epilogue || matches(&lay[in], arena, T, dnorm));
        ran_clean(lay, count, arena, before, T, tl);
        free(ds);
    }
    attnres_plan_destroy(plan);
}

/* One trial of the phase-2 case: a drawn problem and layout, run and judged. */
static void phase2_trial(float *arena, float *before, tally *tl)
{
    const int64_t d = PICK(4, 16, 24, 64);
    const int32_t heads = draw_heads(d);
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, 1);
    p.op = ATTNRES_OP_PHASE2;
    p.heads = heads;
    p.fuse_add = (int32_t)below(2);
    p.epilogue = (int32_t)below(2);
    int huge_t;
    const int64_t T = draw_t(&huge_t);
    /* o1, lse, partial (written with the fused add), sublayer, query,
     * out_gain, out, normed. */
    enum { O1, LSE, PART, SUB, QUERY, GAIN, OUT, NORMED, COUNT };
    layout lay[COUNT] = {
        [O1] = {0, 0, d, 1, 0, 1},
        [LSE] = {0, 0, heads, 1, 0, 1},
        [PART] = {0, 0, d, 1, p.fuse_add, 1},
        [SUB] = {0, 0, d, 1, 0, p.fuse_add},
        [QUERY] = {0, 0, d, 0, 0, 1},
        [GAIN] = {0, 0, d, 0, 0, p.epilogue},
        [OUT] = {0, 0, d, 1, 1, 1},
        [NORMED] = {0, 0, d, 1, 1, p.epilogue},
    };
    draw_layout(lay, COUNT, T, huge_t);
    const int want = model_verdict(lay, COUNT, arena, T, -1, -1, 0);
    attnres_plan *plan = trial_plan(&p, want, arena, before, tl);
    if (!plan)
        return;
    attnres_phase2_args a;
    attnres_phase2_args_init(&a);
    a.o1 = arena + lay[O1].offset;
    a.o1_stride = lay[O1].stride;
    a.lse = arena + lay[LSE].offset;
    a.lse_stride = lay[LSE].stride;
    a.partial = arena + lay[PART].offset;
    a.partial_stride = lay[PART].stride;
    a.sublayer = arena + lay[SUB].offset;
    a.sublayer_stride = lay[SUB].stride;
    a.query = arena + lay[QUERY].offset;
    a.out_gain = arena + lay[GAIN].offset;
    a.out = arena + lay[OUT].offset;
    a.out_stride = lay[OUT].stride;
    a.normed = arena + lay[NORMED].offset;
    a.normed_stride = lay[NORMED].stride;
    char what[160];
    snprintf(what, sizeof what, "phase2 d %lld H %d T %lld fuse %d epilogue %d", (long long)d, heads,
             (long long)T, p.fuse_add, p.epilogue);
    if (judge(attnres_run_phase2(plan, T, &a, NULL), want, arena, before, plan, tl, what)) {
        double *ds = malloc(sizeof(double) * (size_t)(T * (6 * d + heads) + 2 * d));
        REQUIRE(ds);
        double *o1 = ds, *part = o1 + T * d, *sub = part + T * d, *out = sub + T * d, *norm = out + T * d,
               *lse = norm + T * d, *q = lse + T * heads, *g = q + d;
        gather(&lay[O1], before, T, o1);
        gather(&lay[LSE], before, T, lse);
        gather(&lay[PART], before, T, part);
        gather(&lay[SUB], before, T, sub);
        gather(&lay[QUERY], before, T, q);
        gather(&lay[GAIN], before, T, g);
        CHECK(attnres_reference_phase2(&p, T, o1, lse, part, sub, q, 1, 1e-6, g, 1e-6, out, norm) ==
              ATTNRES_OK);
        CHECK(matches(&lay[OUT], arena, T, out));
        CHECK(!p.epilogue || matches(&lay[NORMED], arena, T, norm));
        CHECK(!p.fuse_add || matches(&lay[PART], arena, T, part));
        ran_clean(lay, COUNT, arena, before, T, tl);
        free(ds);
    }
    attnres_plan_destroy(plan);
}

/* One trial of the phase-1 case: a drawn problem and layout, run and
 * judged. Phase 1's outputs share one o1 stride and one lse stride: the
 * first site's, as drawn. Past 64 sites the library compares the outputs
 * with each other by whole ranges, and so does the model. */
static void phase1_trial(float *arena, float *before, tally *tl)
{
    const int64_t d = PICK(4, 16, 24);
    const int32_t heads = draw_heads(d);
    const int n = (int)PICK(1, 2, 3), S = (int)PICK(1, 2, 3, 5, 65, MAXS);
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, n);
    p.op = ATTNRES_OP_PHASE1;
    p.heads = heads;
    p.s = S;
    int huge_t;
    const int64_t T = S > 5 ? PICK(1, 2) : draw_t(&huge_t);
    huge_t = T > 16;
    /* n sources, the queries, S o1 views, S lse views. */
    layout lay[3 + 1 + 2 * MAXS];
    int count = 0;
    for (int k = 0; k < n; k++)
        lay[count++] = (layout){0, 0, d, 1, 0, 1};
    const int iq = count, io1 = count + 1, ilse = count + 1 + S;
    lay[count++] = (layout){0, 0, S * d, 0, 0, 1};
    for (int j = 0; j < S; j++)
        lay[count++] = (layout){0, 0, d, 1, 1, 1};
    for (int j = 0; j < S; j++)
        lay[count++] = (layout){0, 0, heads, 1, 1, 1};
    draw_layout(lay, count, T, huge_t);
    for (int j = 1; j < S; j++) {
        lay[io1 + j].stride = lay[io1].stride;
        lay[ilse + j].stride = lay[ilse].stride;
    }
    const int want = model_verdict(lay, count, arena, T, -1, -1, S > 64);
    attnres_plan *plan = trial_plan(&p, want, arena, before, tl);
    if (!plan)
        return;
    const void *src[n];
    int64_t strides[n];
    void *o1[S];
    float *lse[S];
    source_views(lay, n, arena, src, strides);
    for (int j = 0; j < S; j++) {
        o1[j] = arena + lay[io1 + j].offset;
        lse[j] = arena + lay[ilse + j].offset;
    }
    attnres_phase1_args a;
    attnres_phase1_args_init(&a);
    a.sources = src;
    a.source_strides = strides;
    a.queries = arena + lay[iq].offset;
    a.o1 = o1;
    a.o1_stride = lay[io1].stride;
    a.lse = lse;
    a.lse_stride = lay[ilse].stride;
    char what[160];
    snprintf(what, sizeof what, "phase1 d %lld N %d H %d S %d T %lld", (long long)d, n, heads, S, (long long)T);
    if (judge(attnres_run_phase1(plan, T, &a, NULL), want, arena, before, plan, tl, what)) {
        double *ds = malloc(sizeof(double) * (size_t)(T * d * n + S * d + S * T * (d + heads)));
        REQUIRE(ds);
        const double *dsrc[n];
        gather_sources(lay, n, before, T, ds, dsrc);
        double *q = ds + n * T * d, *do1 = q + S * d, *dlse = do1 + S * T * d;
        gather(&lay[iq], before, T, q);
        CHECK(attnres_reference_phase1(&p, T, dsrc, q, 1, 1e-6, do1, dlse) == ATTNRES_OK);
        int bad = 0;
        for (int j = 0; j < S; j++)
            bad |= !matches(&lay[io1 + j], arena, T, do1 + j * T * d) ||
                   !matches(&lay[ilse + j], arena, T, dlse + j * T * heads);
        CHECK(!bad);
        ran_clean(lay, count, arena, before, T, tl);
        tl->ran_by_range += S > 64;
        free(ds);
    }
    attnres_plan_destroy(plan);
}

static void test_mix_runs_refuse_or_match_reference(void)
{
    run_trials(4, 3000, 0, mix_trial);
}

static void test_phase1_runs_refuse_or_match_reference(void)
{
    run_trials(6, 1500, 1, phase1_trial);
}

static void test_phase2_runs_refuse_or_match_reference(void)
{
    run_trials(5, 2000, 0, phase2_trial);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (!check_listing && test_cpu_open(&cpu) != 0)
        return 1;
    RUN_CASE(test_view_extents_match_exact_arithmetic);
    RUN_CASE(test_view_overlap_matches_byte_model);
    RUN_CASE(test_plans_at_the_limits_refuse_or_match_reference);
    RUN_CASE(test_mix_runs_refuse_or_match_reference);
    RUN_CASE(test_phase1_runs_refuse_or_match_reference);
    RUN_CASE(test_phase2_runs_refuse_or_match_reference);
    attnres_device_close(cpu);
    CHECK_EXIT();
}
