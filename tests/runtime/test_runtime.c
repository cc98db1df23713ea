/*
 * test_runtime.c - unit tests of the public runtime API (attnres.h) on the
 * CPU device.
 *
 * Every result is compared with attnres_reference_mix, the fp64 oracle of
 * DESIGN §1, on fresh random inputs: source rows scaled by factors that span
 * 100x and a query ~ N(0,1)/sqrt(d). Tolerances are those of DESIGN §1,
 * ||out - ref|| / ||ref||: 1e-5 for fp32 storage, 1e-2 for bf16 and fp16
 * with the reference computed from the rounded inputs.
 *
 * Everything the test writes (databases, the binary cache) lives in one
 * mkdtemp directory, removed at the end; ATTNRES_CACHE_DIR points into it so
 * that nothing is written under $HOME.
 */
#define _GNU_SOURCE /* nftw, FTW_PHYS, setenv */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attnres.h"
#include "check.h"
#include "device.h"
#include "test_compare.h"
#include "test_data.h"
#include "test_device.h"
#include "test_scratch.h"

#ifndef ATTNRES_CLI
#error "ATTNRES_CLI must name the attnres command line"
#endif

static char tmpdir[512];
static attnres_device *cpu; /* opened once in main */


/* ------------------------------------------------------------------------
 * One mix problem with its inputs, outputs and fp64 reference
 * ---------------------------------------------------------------------- */

typedef struct mix_case {
    attnres_dtype dtype;
    int64_t d;
    int32_t n, heads;
    attnres_form form;
    int32_t epilogue;
    int64_t T;
    int64_t src_pad; /* source token stride is d + src_pad */
    int64_t out_pad; /* out, partial and normed strides are d + out_pad */
    float scale, eps, alpha; /* 0 means the default */
    uint64_t seed;
} mix_case;

typedef struct mix_data {
    mix_case c;
    attnres_problem p;
    int64_t src_stride, row_stride;
    size_t es, out_bytes;
    void **src;
    const void **src_ptrs;
    int64_t *strides;
    double **src_ref;
    float *query, *gain;
    double *query_ref, *gain_ref;
    void *partial;
    double *partial_ref;
    void *out, *normed;
    double *ref_out, *ref_normed;
    attnres_mix_args args;
} mix_data;

#define POISON 0xA5

static void data_free(mix_data *m)
{
    for (int i = 0; m->src && i < m->c.n; i++)
        free(m->src[i]);
    for (int i = 0; m->src_ref && i < m->c.n; i++)
        free(m->src_ref[i]);
    free(m->src);
    free(m->src_ptrs);
    free(m->strides);
    free(m->src_ref);
    free(m->query);
    free(m->gain);
    free(m->query_ref);
    free(m->gain_ref);
    free(m->partial);
    free(m->partial_ref);
    free(m->out);
    free(m->normed);
    free(m->ref_out);
    free(m->ref_normed);
    memset(m, 0, sizeof *m);
}

/* Builds inputs for case c and computes the reference. 0 on success. */
static int data_make(const mix_case *c, mix_data *m)
{
    memset(m, 0, sizeof *m);
    m->c = *c;
    attnres_problem_init(&m->p, c->dtype, c->d, c->n);
    m->p.heads = c->heads;
    m->p.form = c->form;
    m->p.epilogue = c->epilogue;
    const int64_t d = c->d, T = c->T, rows = T > 0 ? T : 1;
    m->es = attnres_dtype_size(c->dtype);
    m->src_stride = d + c->src_pad;
    m->row_stride = d + c->out_pad;
    m->out_bytes = (size_t)(rows * m->row_stride) * m->es;
    uint64_t s = c->seed ? c->seed : 1;
    m->src = calloc((size_t)c->n, sizeof *m->src);
    m->src_ptrs = calloc((size_t)c->n, sizeof *m->src_ptrs);
    m->strides = calloc((size_t)c->n, sizeof *m->strides);
    m->src_ref = calloc((size_t)c->n, sizeof *m->src_ref);
    m->query = malloc(sizeof(float) * (size_t)d);
    m->gain = malloc(sizeof(float) * (size_t)d);
    m->query_ref = malloc(sizeof(double) * (size_t)d);
    m->gain_ref = malloc(sizeof(double) * (size_t)d);
    m->partial = malloc(m->out_bytes);
    m->partial_ref = malloc(sizeof(double) * (size_t)(rows * d));
    m->out = malloc(m->out_bytes);
    m->normed = malloc(m->out_bytes);
    m->ref_out = malloc(sizeof(double) * (size_t)(rows * d));
    m->ref_normed = malloc(sizeof(double) * (size_t)(rows * d));
    if (!m->src || !m->src_ptrs || !m->strides || !m->src_ref || !m->query || !m->gain || !m->query_ref ||
        !m->gain_ref || !m->partial || !m->partial_ref || !m->out || !m->normed || !m->ref_out || !m->ref_normed)
        return -1;
    for (int i = 0; i < c->n; i++) {
        m->src[i] = malloc((size_t)(rows * m->src_stride) * m->es);
        m->src_ref[i] = malloc(sizeof(double) * (size_t)(rows * d));
        if (!m->src[i] || !m->src_ref[i])
            return -1;
        m->src_ptrs[i] = m->src[i];
        m->strides[i] = m->src_stride;
        for (int64_t t = 0; t < T; t++) {
            /* Row scales from 0.1 to 10: the RMS normalisation must matter. */
            const double factor = pow(10.0, -1.0 + 2.0 * rng_uniform(&s));
            for (int64_t k = 0; k < m->src_stride; k++) {
                const int64_t at = t * m->src_stride + k;
                if (k >= d) {
                    elem_store(c->dtype, m->src[i], at, NAN); /* padding must never be read */
                    continue;
                }
                elem_store(c->dtype, m->src[i], at, (float)(factor * rng_normal(&s)));
                m->src_ref[i][t * d + k] = elem_load(c->dtype, m->src[i], at);
            }
        }
    }
    for (int64_t k = 0; k < d; k++) {
        m->query[k] = (float)(rng_normal(&s) / sqrt((double)d));
        m->query_ref[k] = m->query[k];
        m->gain[k] = (float)(1.0 + 0.1 * rng_normal(&s));
        m->gain_ref[k] = m->gain[k];
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < m->row_stride; k++) {
            const int64_t at = t * m->row_stride + k;
            elem_store(c->dtype, m->partial, at, k < d ? (float)rng_normal(&s) : NAN);
            if (k < d)
                m->partial_ref[t * d + k] = elem_load(c->dtype, m->partial, at);
        }
    attnres_mix_args_init(&m->args);
    if (c->scale)
        m->args.scale = c->scale;
    if (c->eps)
        m->args.eps = c->eps;
    if (c->alpha)
        m->args.alpha = c->alpha;
    m->args.sources = m->src_ptrs;
    m->args.source_strides = c->src_pad ? m->strides : NULL;
    m->args.query = m->query;
    m->args.partial = c->form == ATTNRES_FORM_ADDITIVE ? m->partial : NULL;
    m->args.partial_stride = c->out_pad ? m->row_stride : 0;
    m->args.out = m->out;
    m->args.out_stride = c->out_pad ? m->row_stride : 0;
    m->args.out_gain = c->epilogue ? m->gain : NULL;
    m->args.normed = c->epilogue ? m->normed : NULL;
    m->args.normed_stride = c->out_pad ? m->row_stride : 0;
    m->args.out_eps = 1e-5f;
    memset(m->out, POISON, m->out_bytes);
    memset(m->normed, POISON, m->out_bytes);
    if (T == 0)
        return 0;
    return attnres_reference_mix(&m->p, T, (const double *const *)m->src_ref, m->query_ref, m->args.scale,
                                 m->args.eps, m->args.partial ? m->partial_ref : NULL, m->args.alpha,
                                 c->epilogue ? m->gain_ref : NULL, m->args.out_eps, m->ref_out,
                                 c->epilogue ? m->ref_normed : NULL) == ATTNRES_OK
               ? 0
               : -1;
}

/* ||buf - ref|| / ||ref|| over tokens [t0, t1) (NaN if buf has NaN). */
static double rel_err_range(const mix_data *m, const void *buf, const double *ref, int64_t t0, int64_t t1)
{
    double num = 0, den = 0;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t k = 0; k < m->c.d; k++) {
            const double o = elem_load(m->c.dtype, buf, t * m->row_stride + k), r = ref[t * m->c.d + k];
            num += (o - r) * (o - r);
            den += r * r;
        }
    return sqrt(num) / (sqrt(den) > 0 ? sqrt(den) : 1.0);
}

static double rel_err(const mix_data *m, const void *buf, const double *ref)
{
    return rel_err_range(m, buf, ref, 0, m->c.T);
}

/* 1 if the row padding of an output buffer still holds the poison. */
static int padding_untouched(const mix_data *m, const void *buf)
{
    const unsigned char *b = buf;
    for (int64_t t = 0; t < m->c.T; t++)
        for (size_t i = (size_t)(t * m->row_stride + m->c.d) * m->es; i < (size_t)((t + 1) * m->row_stride) * m->es;
             i++)
            if (b[i] != POISON)
                return 0;
    return 1;
}

static int all_bytes(const void *buf, size_t n, unsigned char v)
{
    const unsigned char *b = buf;
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

static attnres_plan *plan_for(const attnres_problem *p, attnres_db *db, unsigned flags)
{
    attnres_plan *plan = NULL;
    char msg[512] = "";
    int rc = attnres_plan_create(cpu, db, p, flags, &plan, msg, sizeof msg);
    if (rc != ATTNRES_OK)
        fprintf(stderr, "  plan_create: %s (%s)\n", attnres_errstr(rc), msg);
    return plan;
}

/* Case c's problem. */
static void case_problem(const mix_case *c, attnres_problem *p)
{
    attnres_problem_init(p, c->dtype, c->d, c->n);
    p->heads = c->heads;
    p->form = c->form;
    p->epilogue = c->epilogue;
}

/* A plan of case c's problem without a database, and the case's data in
 * *m; NULL, with a failed check and nothing left to free, when either
 * cannot be had. */
static attnres_plan *case_plan(const mix_case *c, mix_data *m)
{
    attnres_problem p;
    case_problem(c, &p);
    attnres_plan *plan = plan_for(&p, NULL, 0);
    CHECK(plan != NULL);
    if (!plan)
        return NULL;
    const int made = data_make(c, m);
    CHECK(made == 0);
    if (made != 0) {
        data_free(m);
        attnres_plan_destroy(plan);
        return NULL;
    }
    return plan;
}

static const char *case_name(const mix_case *c, char *buf, size_t len)
{
    snprintf(buf, len, "%s d=%lld N=%d H=%d %s%s T=%lld src_stride=d+%lld out_stride=d+%lld",
             attnres_dtype_name(c->dtype), (long long)c->d, c->n, c->heads,
             c->form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace", c->epilogue ? "+epilogue" : "",
             (long long)c->T, (long long)c->src_pad, (long long)c->out_pad);
    return buf;
}

/* Runs case c on plan and compares out (and normed) with the reference. */
static void check_plan_on_case(attnres_plan *plan, const mix_case *c)
{
    char name[256];
    mix_data m;
    if (data_make(c, &m) != 0) {
        fprintf(stderr, "  cannot build inputs for %s\n", case_name(c, name, sizeof name));
        CHECK(0);
        data_free(&m);
        return;
    }
    int rc = attnres_run_mix(plan, c->T, &m.args, NULL);
    CHECK(rc == ATTNRES_OK);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "  run %s: %s (%s)\n", case_name(c, name, sizeof name), attnres_errstr(rc),
                attnres_plan_errmsg(plan));
        data_free(&m);
        return;
    }
    const double tol = case_tolerance(c->dtype);
    const double e = rel_err(&m, m.out, m.ref_out);
    CHECK(e <= tol);
    if (!(e <= tol))
        fprintf(stderr, "  %s: out error %.3g > %.1g\n", case_name(c, name, sizeof name), e, tol);
    CHECK(padding_untouched(&m, m.out));
    if (c->epilogue) {
        const double en = rel_err(&m, m.normed, m.ref_normed);
        CHECK(en <= tol);
        if (!(en <= tol))
            fprintf(stderr, "  %s: normed error %.3g > %.1g\n", case_name(c, name, sizeof name), en, tol);
        CHECK(padding_untouched(&m, m.normed));
    } else {
        CHECK(all_bytes(m.normed, m.out_bytes, POISON)); /* no epilogue, no write */
    }
    data_free(&m);
}

/* Plans c's problem without a database and checks it. */
static void check_generic_case(const mix_case *c)
{
    attnres_problem p;
    case_problem(c, &p);
    attnres_plan *plan = plan_for(&p, NULL, 0);
    CHECK(plan != NULL);
    if (!plan)
        return;
    CHECK(attnres_plan_level_get(plan) == ATTNRES_LEVEL_GENERIC);
    check_plan_on_case(plan, c);
    attnres_plan_destroy(plan);
}

/* ------------------------------------------------------------------------
 * Basics: status text, version, problems, devices
 * ---------------------------------------------------------------------- */

static void test_errstr_describes_every_code_and_unknown(void)
{
    const char *unknown = attnres_errstr(-1);
    CHECK(unknown && unknown[0]);
    CHECK(attnres_errstr(13) && strcmp(attnres_errstr(13), unknown) == 0);
    CHECK(attnres_errstr(99999) && strcmp(attnres_errstr(99999), unknown) == 0);
    const char *seen[ATTNRES_EMISMATCH + 1];
    for (int code = ATTNRES_OK; code <= ATTNRES_EMISMATCH; code++) {
        const char *s = attnres_errstr(code);
        seen[code] = s;
        CHECK(s != NULL && s[0] != 0);
        if (!s)
            continue;
        CHECK(strcmp(s, unknown) != 0);
        for (int j = 0; j < code; j++)
            if (seen[j] && strcmp(seen[j], s) == 0) {
                fprintf(stderr, "  codes %d and %d share the text '%s'\n", j, code, s);
                CHECK(0);
            }
    }
}

static void test_version_matches_header(void)
{
    CHECK(strcmp(attnres_version(), ATTNRES_VERSION_STRING) == 0);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", ATTNRES_VERSION_MAJOR, ATTNRES_VERSION_MINOR, ATTNRES_VERSION_PATCH);
    CHECK(strcmp(attnres_version(), want) == 0);
}

static void test_problem_check_rejects_bad_shapes(void)
{
    attnres_problem good, p;
    char msg[256];
    attnres_problem_init(&good, ATTNRES_DTYPE_F32, 64, 3);
    CHECK(attnres_problem_check(&good, msg, sizeof msg) == ATTNRES_OK);
    good.heads = 4;
    good.form = ATTNRES_FORM_ADDITIVE;
    good.epilogue = 1;
    CHECK(attnres_problem_check(&good, msg, sizeof msg) == ATTNRES_OK);

#define EXPECT_BAD(mutation, code)                                                  \
    do {                                                                            \
        p = good;                                                                   \
        mutation;                                                                   \
        msg[0] = 0;                                                                 \
        int rc_ = attnres_problem_check(&p, msg, sizeof msg);                       \
        CHECK(rc_ == (code));                                                       \
        CHECK(msg[0] != 0);                                                         \
        if (rc_ != (code))                                                          \
            fprintf(stderr, "  %s: got %d (%s)\n", #mutation, rc_, msg);            \
    } while (0)
    EXPECT_BAD(p.d = 0, ATTNRES_EINVAL);
    EXPECT_BAD(p.d = -64, ATTNRES_EINVAL);
    EXPECT_BAD(p.n = 0, ATTNRES_EINVAL);
    EXPECT_BAD(p.n = -1, ATTNRES_EINVAL);
    EXPECT_BAD(p.heads = 3, ATTNRES_EINVAL);  /* 3 does not divide 64 */
    EXPECT_BAD(p.heads = 0, ATTNRES_EINVAL);
    EXPECT_BAD(p.form = (attnres_form)7, ATTNRES_EINVAL);
    EXPECT_BAD(p.dtype = (attnres_dtype)9, ATTNRES_EINVAL);
    EXPECT_BAD(p.epilogue = 2, ATTNRES_EINVAL);
#undef EXPECT_BAD
    CHECK(attnres_problem_check(NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    /* A NULL message buffer is allowed. */
    p = good;
    p.d = 0;
    CHECK(attnres_problem_check(&p, NULL, 0) == ATTNRES_EINVAL);

    /* plan_create refuses the same problems, with a message and no plan. */
    attnres_plan *plan = (attnres_plan *)&msg;
    msg[0] = 0;
    CHECK(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(plan == NULL);
    CHECK(strstr(msg, "d") != NULL && msg[0] != 0);
}

static void test_device_open_cpu_fills_info(void)
{
    attnres_device_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    REQUIRE(attnres_device_info_get(cpu, &info) == ATTNRES_OK);
    CHECK(info.backend && strcmp(info.backend, "cpu") == 0);
    CHECK(info.name && info.name[0]);
    CHECK(info.arch && info.arch[0]);
    CHECK(info.driver && info.driver[0]);
    CHECK(info.fingerprint && info.fingerprint[0]);
    CHECK(info.units >= 1);
    CHECK(info.memory > 0);
    if (info.fingerprint && info.name) {
        CHECK(strstr(info.fingerprint, info.name) != NULL);
        CHECK(strstr(info.fingerprint, info.arch) != NULL);
    }
    CHECK(attnres_device_count("cpu") == 1);
    CHECK(attnres_device_info_get(NULL, &info) == ATTNRES_EINVAL);
    CHECK(attnres_device_info_get(cpu, NULL) == ATTNRES_EINVAL);
}

static void test_device_open_rejects_unknown_specs(void)
{
    static const char *const bad[] = {"gpu", "cuda:x", "cpu:", "", "cuda:-1", NULL};
    for (int i = 0; bad[i]; i++) {
        attnres_device *dev = (attnres_device *)&i;
        char msg[256] = "";
        int rc = attnres_device_open(bad[i], &dev, msg, sizeof msg);
        CHECK(rc == ATTNRES_EINVAL);
        CHECK(dev == NULL);
        CHECK(msg[0] != 0);
        if (rc != ATTNRES_EINVAL)
            fprintf(stderr, "  '%s': %s (%s)\n", bad[i], attnres_errstr(rc), msg);
        if (rc == ATTNRES_OK)
            attnres_device_close(dev);
    }
    attnres_device *dev = (attnres_device *)&dev;
    char msg[256] = "";
    CHECK(attnres_device_open(NULL, &dev, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(dev == NULL);
    CHECK(msg[0] != 0);
    /* The message buffer is optional. */
    CHECK(attnres_device_open("gpu", &dev, NULL, 0) == ATTNRES_EINVAL);
    CHECK(attnres_device_open("cpu", NULL, msg, sizeof msg) == ATTNRES_EINVAL);
}

static void test_destructors_accept_null(void)
{
    attnres_plan_destroy(NULL);
    attnres_device_close(NULL);
    attnres_db_close(NULL);
    CHECK(attnres_plan_errmsg(NULL) != NULL);
    CHECK(attnres_device_errmsg(NULL) != NULL);
}

static void test_plan_without_db_is_generic_and_explains_it(void)
{
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 256, 5);
    attnres_plan *plan = plan_for(&p, NULL, 0);
    REQUIRE(plan != NULL);
    CHECK(attnres_plan_level_get(plan) == ATTNRES_LEVEL_GENERIC);
    size_t need = attnres_plan_explain(plan, NULL, 0);
    CHECK(need > 0);
    char *buf = malloc(need + 1);
    if (buf) {
        CHECK(attnres_plan_explain(plan, buf, need + 1) == need);
        CHECK(strlen(buf) == need);
        CHECK(strstr(buf, "generic") != NULL);
        free(buf);
    }
    char small[8];
    CHECK(attnres_plan_explain(plan, small, sizeof small) == need);
    CHECK(strlen(small) == sizeof small - 1);
    attnres_plan_destroy(plan);

    /* REQUIRE_EXACT without a database cannot be satisfied. */
    attnres_plan *none = (attnres_plan *)&p;
    char msg[512] = "";
    CHECK(attnres_plan_create(cpu, NULL, &p, ATTNRES_PLAN_REQUIRE_EXACT, &none, msg, sizeof msg) ==
          ATTNRES_ENOTFOUND);
    CHECK(none == NULL);
    CHECK(msg[0] != 0);
}

/* ------------------------------------------------------------------------
 * Results against the fp64 reference (generic kernels)
 * ---------------------------------------------------------------------- */

static void test_mix_f32_matches_reference(void)
{
    const mix_case cases[] = {
        /* replace, H = 1, padded sources, odd T */
        {ATTNRES_DTYPE_F32, 256, 5, 1, ATTNRES_FORM_REPLACE, 0, 37, 16, 0, 0, 0, 0, 11},
        /* additive with alpha, padded sources and outputs */
        {ATTNRES_DTYPE_F32, 192, 7, 1, ATTNRES_FORM_ADDITIVE, 0, 33, 16, 8, 0, 1e-5f, 0.7f, 12},
        /* multi-head */
        {ATTNRES_DTYPE_F32, 96, 9, 4, ATTNRES_FORM_REPLACE, 0, 17, 16, 0, 0, 0, 0, 13},
        /* epilogue, replace and additive with heads */
        {ATTNRES_DTYPE_F32, 128, 4, 1, ATTNRES_FORM_REPLACE, 1, 21, 0, 0, 0, 0, 0, 14},
        {ATTNRES_DTYPE_F32, 128, 6, 2, ATTNRES_FORM_ADDITIVE, 1, 23, 16, 8, 0.5f, 0, 1.3f, 15},
        /* tiny and odd widths; one column per head */
        {ATTNRES_DTYPE_F32, 5, 3, 1, ATTNRES_FORM_REPLACE, 0, 7, 3, 0, 0, 0, 0, 16},
        {ATTNRES_DTYPE_F32, 5, 3, 5, ATTNRES_FORM_ADDITIVE, 1, 9, 1, 2, 0, 0, 0, 17},
        /* many sources, one token, many tokens */
        {ATTNRES_DTYPE_F32, 64, 25, 1, ATTNRES_FORM_REPLACE, 0, 1, 0, 0, 0, 0, 0, 18},
        {ATTNRES_DTYPE_F32, 64, 3, 2, ATTNRES_FORM_REPLACE, 0, 1001, 16, 0, 0, 0, 0, 19},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_generic_case(&cases[i]);
}

static void test_mix_bf16_and_f16_match_reference_of_rounded_inputs(void)
{
    const attnres_dtype types[] = {ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};
    for (int i = 0; i < 2; i++) {
        const mix_case cases[] = {
            {types[i], 128, 5, 1, ATTNRES_FORM_REPLACE, 0, 33, 16, 0, 0, 0, 0, 21},
            {types[i], 256, 9, 4, ATTNRES_FORM_ADDITIVE, 1, 19, 8, 8, 0, 1e-5f, 0, 22},
            {types[i], 96, 3, 2, ATTNRES_FORM_REPLACE, 1, 7, 0, 0, 0, 0, 0, 23},
        };
        for (size_t j = 0; j < sizeof cases / sizeof cases[0]; j++)
            check_generic_case(&cases[j]);
    }
}

static void test_mix_single_source_returns_it(void)
{
    const attnres_dtype types[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};
    for (int ti = 0; ti < 3; ti++) {
        mix_case c = {types[ti], 96, 1, 3, ATTNRES_FORM_REPLACE, 0, 13, 16, 0, 0, 0, 0, 31};
        mix_data m;
        attnres_plan *plan = case_plan(&c, &m);
        if (!plan)
            continue;
        CHECK(attnres_run_mix(plan, c.T, &m.args, NULL) == ATTNRES_OK);
        /* out == v0 up to the rounding of one multiply by 1/l (l = 1). */
        int worst_ok = 1;
        for (int64_t t = 0; t < c.T; t++)
            for (int64_t k = 0; k < c.d; k++) {
                const double o = elem_load(c.dtype, m.out, t * m.row_stride + k);
                const double v = m.src_ref[0][t * c.d + k];
                const double ulp = c.dtype == ATTNRES_DTYPE_F32 ? 1.2e-7 : 8e-3;
                if (!(fabs(o - v) <= ulp * fabs(v)))
                    worst_ok = 0;
            }
        CHECK(worst_ok);
        data_free(&m);
        attnres_plan_destroy(plan);
    }
}

static void test_mix_zero_tokens_is_a_no_op(void)
{
    mix_case c = {ATTNRES_DTYPE_F32, 64, 3, 1, ATTNRES_FORM_ADDITIVE, 1, 4, 0, 0, 0, 0, 0, 41};
    mix_data m;
    attnres_plan *plan = case_plan(&c, &m);
    if (!plan)
        return;
    CHECK(attnres_run_mix(plan, 0, &m.args, NULL) == ATTNRES_OK);
    CHECK(all_bytes(m.out, m.out_bytes, POISON));
    CHECK(all_bytes(m.normed, m.out_bytes, POISON));
    data_free(&m);
    attnres_plan_destroy(plan);
}

static void test_mix_nan_in_one_source_row_poisons_only_that_token(void)
{
    const mix_case c = {ATTNRES_DTYPE_F32, 64, 4, 1, ATTNRES_FORM_REPLACE, 0, 9, 16, 0, 0, 0, 0, 51};
    const int64_t bad_t = 4;
    mix_data m;
    attnres_plan *plan = case_plan(&c, &m);
    if (!plan)
        return;
    ((float *)m.src[2])[bad_t * m.src_stride + 10] = NAN;
    CHECK(attnres_run_mix(plan, c.T, &m.args, NULL) == ATTNRES_OK);
    int all_nan = 1, others_finite = 1;
    for (int64_t t = 0; t < c.T; t++)
        for (int64_t k = 0; k < c.d; k++) {
            const float o = ((float *)m.out)[t * m.row_stride + k];
            if (t == bad_t)
                all_nan &= isnan(o) != 0;
            else
                others_finite &= isfinite(o) != 0;
        }
    CHECK(all_nan);
    CHECK(others_finite);
    /* The reference was computed before the NaN: the other tokens match. */
    CHECK(rel_err_range(&m, m.out, m.ref_out, 0, bad_t) <= 1e-5);
    CHECK(rel_err_range(&m, m.out, m.ref_out, bad_t + 1, c.T) <= 1e-5);
    data_free(&m);
    attnres_plan_destroy(plan);
}

/* ------------------------------------------------------------------------
 * Bad run arguments
 * ---------------------------------------------------------------------- */

/* Runs with args a on plan; expects `want` (or `alt` if nonzero), a message
 * containing `word`, and out and normed untouched. */
static void expect_run_refused(attnres_plan *plan, mix_data *m, int64_t T, const attnres_mix_args *a, int want,
                               int alt, const char *word, const char *what)
{
    memset(m->out, POISON, m->out_bytes);
    memset(m->normed, POISON, m->out_bytes);
    int rc = attnres_run_mix(plan, T, a, NULL);
    const char *err = attnres_plan_errmsg(plan);
    int ok = rc == want || (alt && rc == alt);
    CHECK(ok);
    CHECK(err && err[0]);
    CHECK(!word || (err && strstr(err, word)));
    CHECK(all_bytes(m->out, m->out_bytes, POISON));
    CHECK(all_bytes(m->normed, m->out_bytes, POISON));
    if (!ok || (word && !(err && strstr(err, word))))
        fprintf(stderr, "  %s: got %s, message '%s'\n", what, attnres_errstr(rc), err ? err : "(null)");
}

static void test_run_rejects_bad_arguments_and_leaves_out_untouched(void)
{
    const mix_case c = {ATTNRES_DTYPE_F32, 64, 3, 1, ATTNRES_FORM_REPLACE, 0, 4, 0, 0, 0, 0, 0, 61};
    mix_data m;
    attnres_plan *plan = case_plan(&c, &m);
    if (!plan)
        return;
    const void *srcs[3];
    int64_t strides[3] = {64, 64, 64};
    attnres_mix_args a;

#define RESET()                                         \
    do {                                                \
        a = m.args;                                     \
        memcpy(srcs, m.src_ptrs, sizeof srcs);          \
        a.sources = srcs;                               \
    } while (0)

    expect_run_refused(plan, &m, c.T, NULL, ATTNRES_EINVAL, 0, NULL, "args NULL");
    RESET();
    expect_run_refused(plan, &m, -1, &a, ATTNRES_EINVAL, 0, "T", "T < 0");
    RESET();
    a.sources = NULL;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, "NULL", "sources NULL");
    RESET();
    srcs[1] = NULL;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, "source 1", "source 1 NULL");
    RESET();
    a.query = NULL;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, NULL, "query NULL");
    RESET();
    a.out = NULL;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, NULL, "out NULL");
    const float bad_eps[] = {0.0f, -1e-6f, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        RESET();
        a.eps = bad_eps[i];
        expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, "eps", "bad eps");
    }
    RESET();
    strides[2] = c.d - 1;
    a.source_strides = strides;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EMISMATCH, ATTNRES_EINVAL, "stride", "source stride < d");
    strides[2] = c.d;
    RESET();
    a.out_stride = c.d - 1;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EMISMATCH, ATTNRES_EINVAL, "stride", "out stride < d");
    RESET();
    a.out_stride = -c.d;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EMISMATCH, ATTNRES_EINVAL, "stride", "negative out stride");
    RESET();
    srcs[0] = (const char *)m.src[0] + 1;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, "align", "misaligned source");
    RESET();
    a.out = (char *)m.out + 1;
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, "align", "misaligned out");
    RESET();
    a.query = (const float *)((const char *)m.query + 1);
    expect_run_refused(plan, &m, c.T, &a, ATTNRES_EINVAL, 0, "align", "misaligned query");

    /* After all of that the plan still runs correctly. */
    RESET();
    memset(m.out, POISON, m.out_bytes);
    CHECK(attnres_run_mix(plan, c.T, &a, NULL) == ATTNRES_OK);
    CHECK(rel_err(&m, m.out, m.ref_out) <= 1e-5);
    data_free(&m);
    attnres_plan_destroy(plan);

    /* The additive form needs partial; the epilogue needs normed, gain and
     * a valid out_eps. */
    const mix_case ce = {ATTNRES_DTYPE_F32, 64, 3, 1, ATTNRES_FORM_ADDITIVE, 1, 4, 0, 0, 0, 0, 0, 62};
    if (!(plan = case_plan(&ce, &m)))
        return;
    RESET();
    a.partial = NULL;
    expect_run_refused(plan, &m, ce.T, &a, ATTNRES_EINVAL, 0, "partial", "additive without partial");
    RESET();
    a.partial = (const char *)m.partial + 2;
    expect_run_refused(plan, &m, ce.T, &a, ATTNRES_EINVAL, 0, "partial", "misaligned partial");
    RESET();
    a.normed = NULL;
    expect_run_refused(plan, &m, ce.T, &a, ATTNRES_EINVAL, 0, "normed", "epilogue without normed");
    RESET();
    a.out_gain = NULL;
    expect_run_refused(plan, &m, ce.T, &a, ATTNRES_EINVAL, 0, "out_gain", "epilogue without out_gain");
    RESET();
    a.out_eps = 0.0f;
    expect_run_refused(plan, &m, ce.T, &a, ATTNRES_EINVAL, 0, "out_eps", "epilogue with out_eps 0");
    RESET();
    a.normed_stride = ce.d - 1;
    expect_run_refused(plan, &m, ce.T, &a, ATTNRES_EMISMATCH, ATTNRES_EINVAL, "stride", "normed stride < d");
    RESET();
    memset(m.out, POISON, m.out_bytes);
    CHECK(attnres_run_mix(plan, ce.T, &a, NULL) == ATTNRES_OK);
    CHECK(rel_err(&m, m.out, m.ref_out) <= 1e-5);
    CHECK(rel_err(&m, m.normed, m.ref_normed) <= 1e-5);
#undef RESET
    data_free(&m);
    attnres_plan_destroy(plan);
}

/* ------------------------------------------------------------------------
 * Databases
 * ---------------------------------------------------------------------- */

static void test_db_open_refuses_missing_and_foreign_files(void)
{
    char path[700], msg[1024] = "";
    attnres_db *db = (attnres_db *)&msg;
    snprintf(path, sizeof path, "%s/missing.db", tmpdir);
    int rc = attnres_db_open(path, &db, msg, sizeof msg);
    CHECK(rc == ATTNRES_EDB);
    CHECK(db == NULL);
    CHECK(strstr(msg, path) != NULL);
    if (rc != ATTNRES_EDB || !strstr(msg, path))
        fprintf(stderr, "  missing db: %s (%s)\n", attnres_errstr(rc), msg);
    struct stat st;
    CHECK(stat(path, &st) != 0); /* a read-only open creates nothing */

    snprintf(path, sizeof path, "%s/notes.txt", tmpdir);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    for (int i = 0; i < 200; i++)
        fprintf(f, "this is a text file, not an SQLite database (line %d)\n", i);
    fclose(f);
    db = (attnres_db *)&msg;
    msg[0] = 0;
    rc = attnres_db_open(path, &db, msg, sizeof msg);
    CHECK(rc == ATTNRES_EDB);
    CHECK(db == NULL);
    CHECK(msg[0] != 0);
    if (rc != ATTNRES_EDB)
        fprintf(stderr, "  text file: %s (%s)\n", attnres_errstr(rc), msg);
    if (rc == ATTNRES_OK)
        attnres_db_close(db);

    CHECK(attnres_db_open(NULL, &db, msg, sizeof msg) == ATTNRES_EINVAL);
}

static int count_bucket_lines(const char *text)
{
    /* A line that begins (after its indent) with "T bucket N": a bucket's
     * own line. Its text may name another bucket ("loaded already for T
     * bucket 1 of this plan") when two buckets share a kernel. */
    int n = 0;
    for (const char *line = text; line;) {
        const char *p = line, *nl = strchr(line, '\n');
        while (*p == ' ')
            p++;
        if (strncmp(p, "T bucket ", 9) == 0 && p[9] >= '0' && p[9] <= '9')
            n++;
        line = nl ? nl + 1 : NULL;
    }
    return n;
}

/* Copies the tuned ci database (the suite's fixture, else the one that
 * test_tuned_db_gives_exact_plans_that_match_reference tuned) to dest; says
 * so and returns -1 when there is none to copy. */
static int copy_ci_db(const char *dest)
{
    const char *suite_db = getenv("ATTNRES_TEST_CI_DB");
    char ci_db[700], cmd[1600];
    snprintf(ci_db, sizeof ci_db, "%s", suite_db && *suite_db ? suite_db : "");
    if (!ci_db[0])
        snprintf(ci_db, sizeof ci_db, "%s/t.db", tmpdir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", ci_db, dest);
    int rc = system(cmd);
    CHECK(rc == 0);
    if (rc != 0) {
        fprintf(stderr, "  no tuned ci database to copy (%s)\n", ci_db);
        return -1;
    }
    return 0;
}

static void test_tuned_db_gives_exact_plans_that_match_reference(void)
{
    char db_path[700], log_path[700], cmd[3000], msg[1024] = "";
    snprintf(db_path, sizeof db_path, "%s/t.db", tmpdir);
    snprintf(log_path, sizeof log_path, "%s/tune.log", tmpdir);
    /* The suite tunes the ci preset once (the ci_db fixture of ctest, which
     * names it in ATTNRES_TEST_CI_DB); this case copies that database and
     * tunes it again, which then measures nothing new. Run alone, it tunes
     * the preset itself. */
    const char *suite_db = getenv("ATTNRES_TEST_CI_DB");
    int len = 0;
    if (suite_db && *suite_db)
        len = snprintf(cmd, sizeof cmd, "cp '%s' '%s' && ", suite_db, db_path);
    snprintf(cmd + len, sizeof cmd - (size_t)len, "'%s' tune --device cpu --preset ci --db '%s' --quiet > '%s' 2>&1",
             ATTNRES_CLI, db_path, log_path);
    int rc = system(cmd);
    CHECK(rc == 0);
    if (rc != 0) {
        fprintf(stderr, "  '%s' failed (%d); its output:\n", cmd, rc);
        FILE *f = fopen(log_path, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f))
            fputs(line, stderr);
        if (f)
            fclose(f);
        return;
    }
    attnres_db *db = NULL;
    rc = attnres_db_open(db_path, &db, msg, sizeof msg);
    REQUIRE(rc == ATTNRES_OK);

    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 256, 5); /* ci: f32 d=256 N=5 H=1 replace */
    attnres_plan *exact = plan_for(&p, db, 0);
    attnres_plan *required = plan_for(&p, db, ATTNRES_PLAN_REQUIRE_EXACT);
    CHECK(exact != NULL);
    CHECK(required != NULL);
    if (exact) {
        CHECK(attnres_plan_level_get(exact) == ATTNRES_LEVEL_EXACT);
        char text[8192];
        attnres_plan_explain(exact, text, sizeof text);
        CHECK(count_bucket_lines(text) == 2);
        if (count_bucket_lines(text) != 2)
            fprintf(stderr, "  explain:\n%s", text);
    }
    if (required)
        CHECK(attnres_plan_level_get(required) == ATTNRES_LEVEL_EXACT);

    /* The second ci problem, bf16 additive with heads and epilogue. */
    attnres_problem pb;
    attnres_problem_init(&pb, ATTNRES_DTYPE_BF16, 512, 9);
    pb.heads = 4;
    pb.form = ATTNRES_FORM_ADDITIVE;
    pb.epilogue = 1;
    attnres_plan *bf = plan_for(&pb, db, ATTNRES_PLAN_REQUIRE_EXACT);
    CHECK(bf != NULL);

    /* A problem the database does not hold. */
    attnres_problem q;
    attnres_problem_init(&q, ATTNRES_DTYPE_F32, 128, 3);
    attnres_plan *none = (attnres_plan *)&q;
    msg[0] = 0;
    rc = attnres_plan_create(cpu, db, &q, ATTNRES_PLAN_REQUIRE_EXACT, &none, msg, sizeof msg);
    CHECK(rc == ATTNRES_ENOTFOUND);
    CHECK(none == NULL);
    CHECK(msg[0] != 0);
    attnres_plan *fallback = plan_for(&q, db, 0);
    CHECK(fallback != NULL);
    if (fallback)
        CHECK(attnres_plan_level_get(fallback) == ATTNRES_LEVEL_GENERIC);

    /* Plans do not keep the database open. */
    attnres_db_close(db);

    const int64_t ts[] = {1, 16, 17, 300};
    for (int i = 0; i < 4; i++) {
        const mix_case c = {ATTNRES_DTYPE_F32, 256, 5, 1, ATTNRES_FORM_REPLACE, 0, ts[i], i % 2 ? 16 : 0, 0,
                            0, 0, 0, 71 + (uint64_t)i};
        if (exact)
            check_plan_on_case(exact, &c);
        if (required)
            check_plan_on_case(required, &c);
    }
    if (bf) {
        const mix_case cb = {ATTNRES_DTYPE_BF16, 512, 9, 4, ATTNRES_FORM_ADDITIVE, 1, 65, 16, 8, 0, 0, 0.5f, 81};
        check_plan_on_case(bf, &cb);
    }
    if (fallback) {
        const mix_case cq = {ATTNRES_DTYPE_F32, 128, 3, 1, ATTNRES_FORM_REPLACE, 0, 5, 0, 0, 0, 0, 0, 82};
        check_plan_on_case(fallback, &cq);
    }
    attnres_plan_destroy(exact);
    attnres_plan_destroy(required);
    attnres_plan_destroy(bf);
    attnres_plan_destroy(fallback);
}

/* Plans of one shape share what the database handle looked up and the
 * kernels they load: the second plan says so, the plans are destroyed in
 * any order and the one left still runs. What the handle remembers never
 * hides a change: a problem tuned while the handle is open plans exactly
 * from that handle at once. */
static void test_plans_share_kernels_and_see_a_database_tuned_meanwhile(void)
{
    char db_path[700], problems[700], log_path[700], cmd[3200], msg[1024] = "";
    snprintf(db_path, sizeof db_path, "%s/share.db", tmpdir);
    snprintf(problems, sizeof problems, "%s/share.problems", tmpdir);
    snprintf(log_path, sizeof log_path, "%s/share.log", tmpdir);
    if (copy_ci_db(db_path))
        return;
    attnres_db *db = NULL;
    int rc = attnres_db_open(db_path, &db, msg, sizeof msg);
    REQUIRE(rc == ATTNRES_OK);

    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 256, 5); /* tuned by the ci preset */
    attnres_plan *plans[3];
    for (int i = 0; i < 3; i++)
        plans[i] = plan_for(&p, db, ATTNRES_PLAN_REQUIRE_EXACT);
    CHECK(plans[0] && plans[1] && plans[2]);
    if (plans[0] && plans[1] && plans[2]) {
        char first[8192], second[8192];
        attnres_plan_explain(plans[0], first, sizeof first);
        attnres_plan_explain(plans[1], second, sizeof second);
        /* The first plan loads its own kernels (one may serve two of its
         * T buckets when one variant won both). */
        CHECK(strstr(first, "loaded already by another plan") == NULL);
        CHECK(strstr(second, "loaded already by another plan") != NULL);
        if (!strstr(second, "loaded already by another plan"))
            fprintf(stderr, "  the second plan of a shape loaded its own kernels:\n%s", second);
        const mix_case c = {ATTNRES_DTYPE_F32, 256, 5, 1, ATTNRES_FORM_REPLACE, 0, 17, 0, 0, 0, 0, 0, 91};
        /* The plan that loaded the kernels goes first; the others keep them. */
        attnres_plan_destroy(plans[0]);
        check_plan_on_case(plans[2], &c);
        attnres_plan_destroy(plans[2]);
        check_plan_on_case(plans[1], &c);
        attnres_plan_destroy(plans[1]);
    } else {
        for (int i = 0; i < 3; i++)
            attnres_plan_destroy(plans[i]);
    }

    /* A shape the ci preset does not tune: refused while it is untuned... */
    attnres_problem q;
    attnres_problem_init(&q, ATTNRES_DTYPE_F32, 64, 2);
    attnres_plan *plan = NULL;
    rc = attnres_plan_create(cpu, db, &q, ATTNRES_PLAN_REQUIRE_EXACT, &plan, msg, sizeof msg);
    CHECK(rc == ATTNRES_ENOTFOUND);
    attnres_plan_destroy(plan);
    plan = NULL;
    /* ...and exact once another process has tuned it. */
    FILE *f = fopen(problems, "w");
    CHECK(f != NULL);
    if (!f) {
        attnres_db_close(db);
        return;
    }
    fprintf(f, "mix f32 64 2 1 replace 0 1\n");
    fclose(f);
    snprintf(cmd, sizeof cmd,
             "'%s' tune --device cpu --problems '%s' --db '%s' --strategy random --budget 1 --quiet > '%s' 2>&1",
             ATTNRES_CLI, problems, db_path, log_path);
    rc = system(cmd);
    CHECK(rc == 0);
    if (rc != 0)
        fprintf(stderr, "  '%s' failed (%d)\n", cmd, rc);
    rc = attnres_plan_create(cpu, db, &q, ATTNRES_PLAN_REQUIRE_EXACT, &plan, msg, sizeof msg);
    CHECK(rc == ATTNRES_OK);
    if (rc != ATTNRES_OK)
        fprintf(stderr, "  a problem tuned while the database was open: %s (%s)\n", attnres_errstr(rc), msg);
    if (plan) {
        CHECK(attnres_plan_level_get(plan) == ATTNRES_LEVEL_EXACT);
        const mix_case cq = {ATTNRES_DTYPE_F32, 64, 2, 1, ATTNRES_FORM_REPLACE, 0, 3, 0, 0, 0, 0, 0, 92};
        check_plan_on_case(plan, &cq);
    }
    attnres_plan_destroy(plan);
    attnres_db_close(db);
}

/* Runs sql on the database file at path with SQLite itself, as another
 * process would; SQLITE_OK or its failure. */
static int raw_exec(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    int rc = sqlite3_open_v2(path, &h, SQLITE_OPEN_READWRITE, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(h, sql, NULL, NULL, NULL);
    sqlite3_close(h);
    return rc;
}

/* A provisional winner (schema v9: its final round was disturbed on every
 * try) is served like any other, and the plan's explanation says so below
 * its bucket, with the evidence and what decides it again; once it is not
 * provisional, the explanation of a new plan says nothing of it. */
static void test_provisional_winner_is_explained(void)
{
    char db_path[700], msg[1024] = "";
    snprintf(db_path, sizeof db_path, "%s/provisional.db", tmpdir);
    if (copy_ci_db(db_path))
        return;
    CHECK(raw_exec(db_path, "UPDATE winners SET provisional = 1, disturbance = 'threads waited 77% of the window "
                            "for a CPU, 0% stolen, 1100 preemptions/s'") == SQLITE_OK);
    attnres_db *db = NULL;
    REQUIRE(attnres_db_open(db_path, &db, msg, sizeof msg) == ATTNRES_OK);
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 256, 5); /* tuned by the ci preset */
    attnres_plan *plan = plan_for(&p, db, ATTNRES_PLAN_REQUIRE_EXACT);
    CHECK(plan != NULL);
    char text[8192] = "";
    if (plan) {
        attnres_plan_explain(plan, text, sizeof text);
        CHECK(strstr(text, "    provisional: the final round that chose it was disturbed by other work on every try "
                           "(threads waited 77% of the window for a CPU, 0% stolen, 1100 preemptions/s); "
                           "`attnres tune --revalidate` on a quiet machine decides it again\n") != NULL);
        CHECK(count_bucket_lines(text) == 2);
        const mix_case c = {ATTNRES_DTYPE_F32, 256, 5, 1, ATTNRES_FORM_REPLACE, 0, 17, 0, 0, 0, 0, 0, 93};
        check_plan_on_case(plan, &c);
    }
    attnres_plan_destroy(plan);
    CHECK(raw_exec(db_path, "UPDATE winners SET provisional = 0, disturbance = NULL") == SQLITE_OK);
    plan = plan_for(&p, db, ATTNRES_PLAN_REQUIRE_EXACT);
    CHECK(plan != NULL);
    if (plan) {
        attnres_plan_explain(plan, text, sizeof text);
        CHECK(strstr(text, "provisional") == NULL);
    }
    attnres_plan_destroy(plan);
    attnres_db_close(db);
}

/* ------------------------------------------------------------------------
 * Threads
 * ---------------------------------------------------------------------- */

/* Runs fn on each of the n jobs (job_size bytes apart) in a thread of its
 * own and waits for them all; returns how many started. After a partial
 * start it joins none, since the started ones wait at their barrier for the
 * rest for ever. */
static int run_threads(int n, void *(*fn)(void *), void *jobs, size_t job_size)
{
    pthread_t tids[n];
    int started = 0;
    for (int i = 0; i < n; i++)
        started += pthread_create(&tids[i], NULL, fn, (char *)jobs + (size_t)i * job_size) == 0;
    if (started == n)
        for (int i = 0; i < n; i++)
            pthread_join(tids[i], NULL);
    return started;
}

enum { THREADS = 4, THREAD_ITERS = 40 };

typedef struct thread_job {
    attnres_plan *plan;
    mix_data data;
    pthread_barrier_t *start;
    int failures;
    double worst;
} thread_job;

static void *thread_main(void *arg)
{
    thread_job *j = arg;
    pthread_barrier_wait(j->start);
    for (int it = 0; it < THREAD_ITERS; it++) {
        memset(j->data.out, POISON, j->data.out_bytes);
        memset(j->data.normed, POISON, j->data.out_bytes);
        if (attnres_run_mix(j->plan, j->data.c.T, &j->data.args, NULL) != ATTNRES_OK) {
            j->failures++;
            continue;
        }
        double e = rel_err(&j->data, j->data.out, j->data.ref_out);
        if (j->data.c.epilogue) {
            double en = rel_err(&j->data, j->data.normed, j->data.ref_normed);
            e = en > e || isnan(en) ? en : e;
        }
        if (!(e <= 1e-5))
            j->failures++;
        if (!(e <= j->worst))
            j->worst = e;
    }
    return NULL;
}

static void test_plans_are_safe_from_four_threads(void)
{
    /* Two plans, each shared by two threads with their own buffers. */
    attnres_problem pa, pb;
    attnres_problem_init(&pa, ATTNRES_DTYPE_F32, 128, 5);
    attnres_problem_init(&pb, ATTNRES_DTYPE_F32, 96, 7);
    pb.heads = 4;
    pb.form = ATTNRES_FORM_ADDITIVE;
    pb.epilogue = 1;
    attnres_plan *plan_a = plan_for(&pa, NULL, 0), *plan_b = plan_for(&pb, NULL, 0);
    CHECK(plan_a && plan_b);
    if (!plan_a || !plan_b) {
        attnres_plan_destroy(plan_a);
        attnres_plan_destroy(plan_b);
        return;
    }
    thread_job jobs[THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    const int64_t ts[THREADS] = {5, 31, 64, 129};
    int made = 0;
    for (int i = 0; i < THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].plan = i % 2 ? plan_b : plan_a;
        jobs[i].start = &start;
        const attnres_problem *p = i % 2 ? &pb : &pa;
        const mix_case c = {p->dtype, p->d, p->n, p->heads, p->form, p->epilogue, ts[i], 8, 0, 0, 0, 0,
                            101 + (uint64_t)i};
        if (data_make(&c, &jobs[i].data) == 0)
            made++;
    }
    CHECK(made == THREADS);
    if (made == THREADS) {
        REQUIRE(run_threads(THREADS, thread_main, jobs, sizeof jobs[0]) == THREADS);
        for (int i = 0; i < THREADS; i++) {
            CHECK(jobs[i].failures == 0);
            if (jobs[i].failures)
                fprintf(stderr, "  thread %d: %d of %d runs wrong (worst error %.3g)\n", i, jobs[i].failures,
                        THREAD_ITERS, jobs[i].worst);
        }
    }
    for (int i = 0; i < THREADS; i++)
        data_free(&jobs[i].data);
    pthread_barrier_destroy(&start);
    attnres_plan_destroy(plan_a);
    attnres_plan_destroy(plan_b);
}

/* ---- struct_size of caller-allocated structs -------------------------- */

/* A struct from an attnres.h this library cannot read (older than 0.2.0,
 * or newer than itself) is refused before any of it is read, with a
 * message naming the struct, the sizes and the fix. */
static void test_struct_size_is_checked_with_a_clear_message(void)
{
    char msg[512] = "";
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 2);
    CHECK(p.struct_size == sizeof p);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_OK);
    p.struct_size = sizeof p - 8; /* as if built against a header before 0.2.0 */
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "attnres_problem.struct_size") && strstr(msg, "attnres_problem_init"));
    attnres_plan *plan = (attnres_plan *)&p; /* must be overwritten with NULL */
    CHECK(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_EINVAL && !plan);
    CHECK(strstr(msg, "struct_size") != NULL);
    p.struct_size = sizeof p + 8; /* a newer header: fields this library cannot know */
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    p.struct_size = 0;
    CHECK(attnres_reference_mix(&p, 1, NULL, NULL, 1, 1e-6, NULL, 1, NULL, 1e-6, NULL, NULL) == ATTNRES_EINVAL);

    attnres_device_info info = {.struct_size = offsetof(attnres_device_info, simulated)};
    CHECK(attnres_device_info_get(cpu, &info) == ATTNRES_EINVAL && info.backend == NULL);
    CHECK(strstr(attnres_device_errmsg(cpu), "attnres_device_info.struct_size") != NULL);
    info.struct_size = sizeof info + 1;
    CHECK(attnres_device_info_get(cpu, &info) == ATTNRES_EINVAL && info.backend == NULL);
    info.struct_size = sizeof info;
    CHECK(attnres_device_info_get(cpu, &info) == ATTNRES_OK && strcmp(info.backend, "cpu") == 0);

    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 2);
    plan = plan_for(&p, NULL, 0);
    REQUIRE(plan != NULL);
    float src[2][64] = {{0}}, query[64] = {0}, out[64];
    const void *sources[2] = {src[0], src[1]};
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    CHECK(a.struct_size == sizeof a);
    a.sources = sources;
    a.query = query;
    a.out = out;
    CHECK(attnres_run_mix(plan, 1, &a, NULL) == ATTNRES_OK);
    a.struct_size = sizeof a + 8;
    CHECK(attnres_run_mix(plan, 1, &a, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "0.2.0") != NULL);
    CHECK(strstr(attnres_plan_errmsg(plan), "attnres_mix_args.struct_size") &&
          strstr(attnres_plan_errmsg(plan), "attnres_mix_args_init"));
    attnres_plan_destroy(plan);

    /* The phase entries check theirs too. */
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    CHECK(a1.struct_size == sizeof a1 && a2.struct_size == sizeof a2);
    attnres_problem p2;
    attnres_problem_init(&p2, ATTNRES_DTYPE_F32, 64, 1);
    p2.op = ATTNRES_OP_PHASE2;
    plan = plan_for(&p2, NULL, 0);
    REQUIRE(plan != NULL);
    a2.o1 = a2.partial = out;
    a2.lse = a2.query = query;
    a2.out = src[0];
    a2.struct_size = 0;
    CHECK(attnres_run_phase2(plan, 1, &a2, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "attnres_phase2_args.struct_size") != NULL);
    attnres_plan_destroy(plan);
}

/* A caller built against an older attnres.h of 0.2.0 or later passes a
 * smaller struct_size: the library takes it, reads no byte past it, and
 * the fields it lacks keep their defaults. No public struct has grown
 * since 0.2.0, so this is shown two ways: each struct cut at its 0.2.0
 * layout's last field (less than sizeof where the compiler pads the
 * tail), and the completion itself on a struct one field shorter. */
static void test_struct_cut_at_an_older_size_is_taken(void)
{
    /* attnres_device_info at 0.2.0 ends at `simulated`, an int after
     * pointers: 68 of its 72 bytes on x86-64. The 4 bytes past the cut are
     * the caller's own and stay as they were. */
    struct {
        attnres_device_info info;
        unsigned char guard[16];
    } older;
    memset(&older, 0xA5, sizeof older);
    older.info.struct_size = AR_DEVICE_INFO_SIZE_0_2;
    CHECK(attnres_device_info_get(cpu, &older.info) == ATTNRES_OK);
    CHECK(strcmp(older.info.backend, "cpu") == 0 && older.info.simulated == 0);
    CHECK(older.info.struct_size == AR_DEVICE_INFO_SIZE_0_2);
    const unsigned char *tail = (const unsigned char *)&older.info + AR_DEVICE_INFO_SIZE_0_2;
    for (size_t i = 0; i < sizeof older - AR_DEVICE_INFO_SIZE_0_2; i++)
        CHECK(tail[i] == 0xA5);

    /* The problem and the run arguments at their 0.2.0 sizes plan and run. */
    char msg[512] = "";
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 2);
    p.struct_size = AR_PROBLEM_SIZE_0_2;
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_OK);
    attnres_plan *plan = plan_for(&p, NULL, 0);
    REQUIRE(plan != NULL);
    float src[2][64], query[64], out[64];
    for (int k = 0; k < 64; k++)
        src[0][k] = 1, src[1][k] = 3, query[k] = 0;
    const void *sources[2] = {src[0], src[1]};
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.struct_size = AR_MIX_ARGS_SIZE_0_2;
    a.sources = sources;
    a.query = query;
    a.out = out;
    /* A zero query scores both sources alike: out is their mean. */
    CHECK(attnres_run_mix(plan, 1, &a, NULL) == ATTNRES_OK && fabsf(out[0] - 2) < 1e-6f);
    attnres_plan_destroy(plan);

    /* The completion: a caller whose struct ends before the last field
     * gets that field's default, and its own values for the rest. */
    attnres_mix_args caller, own;
    memset(&caller, 0x5A, sizeof caller);
    caller.struct_size = offsetof(attnres_mix_args, normed_stride);
    caller.alpha = 0.5f;
    attnres_mix_args_init(&own);
    own.normed_stride = 7; /* a default the caller's struct cannot reach */
    ar_struct_adopt(&caller, &own, sizeof own);
    CHECK(own.struct_size == sizeof own && own.alpha == 0.5f && own.normed_stride == 7);
    CHECK(memcmp(&own.sources, &caller.sources, sizeof own.sources) == 0);
}

/* ---- failure messages under concurrency ------------------------------ */

#define MSG_THREADS 6
#define MSG_ITERS 400

typedef struct msg_job {
    int index;
    attnres_plan *plan; /* shared by every thread */
    pthread_barrier_t *start;
    int wrong;          /* messages that were not this thread's */
    char example[600];  /* the first wrong one */
} msg_job;

static void msg_wrong(msg_job *j, const char *what, const char *got)
{
    if (!j->wrong++)
        snprintf(j->example, sizeof j->example, "%s: \"%.500s\"", what, got);
}

/* Each thread fails on the shared device and plan with numbers only it
 * uses, in between successful runs, and checks that every message it reads
 * back names its own numbers: another thread's failure must not replace
 * it, and a success must not clear it. */
static void *msg_thread(void *arg)
{
    msg_job *j = arg;
    float src[2][64], query[64], out[64];
    for (int k = 0; k < 64; k++) {
        src[0][k] = (float)k;
        src[1][k] = 1.0f;
        query[k] = 0.01f;
    }
    const void *sources[2] = {src[0], src[1]};
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = sources;
    a.query = query;
    a.out = out;
    pthread_barrier_wait(j->start);
    for (int i = 0; i < MSG_ITERS; i++) {
        const int tag = 1000000 + j->index * 10000 + i;
        char want[64], msg[512];
        /* A plan that cannot be made: the device's message and msg. */
        attnres_problem p;
        attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, -tag);
        attnres_plan *bad = NULL;
        snprintf(want, sizeof want, "(got %d)", -tag);
        if (attnres_plan_create(cpu, NULL, &p, 0, &bad, msg, sizeof msg) != ATTNRES_EINVAL || bad)
            msg_wrong(j, "plan_create did not fail", msg);
        if (!strstr(msg, want))
            msg_wrong(j, "plan_create's msg", msg);
        if (!strstr(attnres_device_errmsg(cpu), want))
            msg_wrong(j, "attnres_device_errmsg", attnres_device_errmsg(cpu));
        /* A run that fails, then one that succeeds: the plan's message. */
        snprintf(want, sizeof want, "(got %d)", -tag);
        if (attnres_run_mix(j->plan, -tag, &a, NULL) != ATTNRES_EINVAL)
            msg_wrong(j, "run with T < 0 did not fail", attnres_plan_errmsg(j->plan));
        if (attnres_run_mix(j->plan, 1, &a, NULL) != ATTNRES_OK)
            msg_wrong(j, "run failed", attnres_plan_errmsg(j->plan));
        if (!strstr(attnres_plan_errmsg(j->plan), want))
            msg_wrong(j, "attnres_plan_errmsg", attnres_plan_errmsg(j->plan));
        /* The device's message is still this thread's own. */
        snprintf(want, sizeof want, "(got %d)", -tag);
        if (!strstr(attnres_device_errmsg(cpu), want))
            msg_wrong(j, "attnres_device_errmsg after the runs", attnres_device_errmsg(cpu));
    }
    return NULL;
}

static void test_failure_messages_are_each_threads_own(void)
{
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 2);
    attnres_plan *plan = plan_for(&p, NULL, 0);
    REQUIRE(plan != NULL);
    /* A thread that never failed on a handle reads an empty message. */
    CHECK(strcmp(attnres_plan_errmsg(plan), "") == 0);
    msg_job jobs[MSG_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, MSG_THREADS);
    for (int i = 0; i < MSG_THREADS; i++)
        jobs[i] = (msg_job){.index = i, .plan = plan, .start = &start};
    REQUIRE(run_threads(MSG_THREADS, msg_thread, jobs, sizeof jobs[0]) == MSG_THREADS);
    for (int i = 0; i < MSG_THREADS; i++) {
        CHECK(jobs[i].wrong == 0);
        if (jobs[i].wrong)
            fprintf(stderr, "  thread %d: %d wrong messages, first %s\n", i, jobs[i].wrong, jobs[i].example);
    }
    /* The other threads' failures left this thread's view alone. */
    CHECK(strcmp(attnres_plan_errmsg(plan), "") == 0);
    pthread_barrier_destroy(&start);
    attnres_plan_destroy(plan);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (scratch_make("runtime", tmpdir, sizeof tmpdir) != 0)
        return 1;
    /* Kernels compiled or loaded by this test go to a cache inside tmpdir. */
    char cache[700];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    setenv("ATTNRES_CACHE_DIR", cache, 1);

    if (test_cpu_open(&cpu) != 0) {
        scratch_remove(tmpdir);
        return 1;
    }

    RUN_CASE(test_errstr_describes_every_code_and_unknown);
    RUN_CASE(test_version_matches_header);
    RUN_CASE(test_problem_check_rejects_bad_shapes);
    RUN_CASE(test_device_open_cpu_fills_info);
    RUN_CASE(test_device_open_rejects_unknown_specs);
    RUN_CASE(test_destructors_accept_null);
    RUN_CASE(test_plan_without_db_is_generic_and_explains_it);
    RUN_CASE(test_mix_f32_matches_reference);
    RUN_CASE(test_mix_bf16_and_f16_match_reference_of_rounded_inputs);
    RUN_CASE(test_mix_single_source_returns_it);
    RUN_CASE(test_mix_zero_tokens_is_a_no_op);
    RUN_CASE(test_mix_nan_in_one_source_row_poisons_only_that_token);
    RUN_CASE(test_run_rejects_bad_arguments_and_leaves_out_untouched);
    RUN_CASE(test_db_open_refuses_missing_and_foreign_files);
    RUN_CASE(test_plans_are_safe_from_four_threads);
    RUN_CASE(test_failure_messages_are_each_threads_own);
    RUN_CASE(test_struct_size_is_checked_with_a_clear_message);
    RUN_CASE(test_struct_cut_at_an_older_size_is_taken);
    RUN_CASE(test_tuned_db_gives_exact_plans_that_match_reference);
    RUN_CASE(test_plans_share_kernels_and_see_a_database_tuned_meanwhile);
    RUN_CASE(test_provisional_winner_is_explained);

    attnres_device_close(cpu);
    scratch_remove(tmpdir);
    CHECK_EXIT();
}
