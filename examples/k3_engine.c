/*
 * k3_engine.c - a small inference engine embedding libattnres.
 *
 * It plays what an engine does with a K3-shaped Block AttnRes model
 * (k3_model.h: 93 layers, blocks of 12, 186 routing sites, at most 9
 * sources): at model load it plans every routing site once, from a tuning
 * database when one is given; then it runs the residual path of one forward
 * pass over T tokens, with a toy sublayer standing in for attention and the
 * MLP, and checks it against the fp64 reference of the library:
 *   - per site, the library's output against attnres_reference_mix of the
 *     very inputs the engine gave it (DESIGN §1 tolerance: fp32 1e-5,
 *     bf16 1e-2);
 *   - end to end, the final residual state against a forward pass computed
 *     entirely in fp64.
 * With --train it also runs a training step on nine of the sites (N = 1..9):
 * the mix forward, a loss, the mix backward (attnres_run_mix_backward, its
 * workspace asked for at load), and a check of the gradients of the sources,
 * the pseudo-query w and the RMSNorm gain g against
 * attnres_reference_mix_backward in fp64, at the same tolerance.
 *
 * The sizes are K3's except the row width: d = 7168 in K3, 256 by default
 * here because the example runs on the CPU (host pointers).
 *
 * Usage: k3_engine [--db FILE] [--form phase|mix] [--dtype f32|bf16] [--d D]
 *                  [--tokens T] [--train] [--require-exact] [--explain SITE] [--quiet]
 * Exit status: 0 pass, 1 failure, 2 usage error.
 *
 * Build against an installed libattnres:
 *   cc -O2 k3_engine.c $(pkg-config --cflags --libs attnres) -lm -o k3_engine
 * or with CMake: find_package(attnres) and link attnres::attnres (see
 * examples/CMakeLists.txt).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <attnres.h>

#include "k3_model.h"

/* ---- small helpers ----------------------------------------------------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A fixed-seed generator, so every run sees the same model and input. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rng_normal(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        u[i] = ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2.0 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

/* Storage elements: fp32 or bf16 (round to nearest even). */
static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float load(attnres_dtype dt, const void *buf, int64_t i)
{
    return dt == ATTNRES_DTYPE_F32 ? ((const float *)buf)[i] : bf16_to_f32(((const uint16_t *)buf)[i]);
}
static void store(attnres_dtype dt, void *buf, int64_t i, float v)
{
    if (dt == ATTNRES_DTYPE_F32)
        ((float *)buf)[i] = v;
    else
        ((uint16_t *)buf)[i] = f32_to_bf16(v);
}

static double rel_err(const double *got, const double *ref, int64_t count)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < count; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- the model ---------------------------------------------------------- */

typedef struct model {
    int64_t d, T;
    attnres_dtype dtype;
    k3_form form;
    float *w, *g;      /* [K3_SITES][d] pseudo-queries and RMSNorm gains */
    float *u;          /* [K3_SITES][d] folded: u = g * w */
    double *u64;       /* the same in fp64 */
    float *a;          /* [K3_SITES][d] toy sublayer weights */
    double *embedding; /* [T][d] b_0 */
} model;

/* Pseudo-queries are scaled so that scores are O(1), as trained ones are. */
static int model_init(model *m)
{
    const int64_t d = m->d;
    m->w = malloc(sizeof(float) * K3_SITES * d);
    m->g = malloc(sizeof(float) * K3_SITES * d);
    m->u = malloc(sizeof(float) * K3_SITES * d);
    m->u64 = malloc(sizeof(double) * K3_SITES * d);
    m->a = malloc(sizeof(float) * K3_SITES * d);
    m->embedding = malloc(sizeof(double) * m->T * d);
    if (!m->w || !m->g || !m->u || !m->u64 || !m->a || !m->embedding)
        return -1;
    for (int s = 0; s < K3_SITES; s++) {
        float *w = m->w + s * d, *g = m->g + s * d;
        for (int64_t k = 0; k < d; k++) {
            w[k] = (float)(2.0 * rng_normal() / sqrt((double)d));
            g[k] = (float)(1.0 + 0.1 * rng_normal()); /* the RMSNorm gain, folded in */
            m->a[s * d + k] = (float)rng_normal();
        }
        attnres_fold_query(w, g, m->u + s * d, d);
        for (int64_t k = 0; k < d; k++)
            m->u64[s * d + k] = m->u[s * d + k];
    }
    for (int64_t i = 0; i < m->T * d; i++)
        m->embedding[i] = rng_normal();
    return 0;
}

/* Frees each of the n buffers (the free functions below list theirs). */
static void free_each(void *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
}

static void model_free(model *m)
{
    void *const bufs[] = {m->w, m->g, m->u, m->u64, m->a, m->embedding};
    free_each(bufs, sizeof bufs / sizeof bufs[0]);
}

/* The toy sublayer of site s: f = 0.5 tanh(a_s * h / rms(h)), per token.
 * Bounded and input dependent, so that every site's sources differ. */
static void sublayer_f64(const model *m, int s, const double *h, double *f)
{
    const int64_t d = m->d;
    for (int64_t t = 0; t < m->T; t++) {
        double ss = 0;
        for (int64_t k = 0; k < d; k++)
            ss += h[t * d + k] * h[t * d + k];
        const double r = 1.0 / sqrt(ss / (double)d + (double)K3_EPS);
        for (int64_t k = 0; k < d; k++)
            f[t * d + k] = 0.5 * tanh((double)m->a[s * d + k] * h[t * d + k] * r);
    }
}

static void sublayer_storage(const model *m, int s, const void *h, void *f)
{
    const int64_t d = m->d;
    for (int64_t t = 0; t < m->T; t++) {
        float ss = 0;
        for (int64_t k = 0; k < d; k++) {
            const float x = load(m->dtype, h, t * d + k);
            ss += x * x;
        }
        const float r = 1.0f / sqrtf(ss / (float)d + K3_EPS);
        for (int64_t k = 0; k < d; k++)
            store(m->dtype, f, t * d + k, 0.5f * tanhf(m->a[s * d + k] * load(m->dtype, h, t * d + k) * r));
    }
}

/* ---- the fp64 forward pass ---------------------------------------------- */

/* Writes the final block representation (the last block's sum) and the
 * last site's mix output. */
static int forward_reference(const model *m, double *last_block, double *last_h)
{
    const int64_t d = m->d, td = m->T * d;
    double *bank = malloc(sizeof(double) * td * K3_MAX_SOURCES);
    double *b = malloc(sizeof(double) * td), *h = malloc(sizeof(double) * td), *f = malloc(sizeof(double) * td);
    int rc = bank && b && h && f ? 0 : -1;
    if (rc == 0)
        memcpy(bank, m->embedding, sizeof(double) * td);
    for (int blk = 0; rc == 0 && blk < K3_BLOCKS; blk++) {
        const double *src[K3_MAX_SOURCES];
        for (int i = 0; i <= blk; i++)
            src[i] = bank + i * td;
        src[blk + 1] = b;
        for (int j = 0; rc == 0 && j < k3_block_sites(blk); j++) {
            const int s = k3_block_first(blk) + j;
            attnres_problem p;
            attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, blk + 1 + (j > 0));
            if (attnres_reference_mix(&p, m->T, src, m->u64 + s * d, 1.0, K3_EPS, NULL, 1.0, NULL, 1e-6, h, NULL)) {
                rc = -1;
                break;
            }
            sublayer_f64(m, s, h, f);
            for (int64_t i = 0; i < td; i++)
                b[i] = j == 0 ? f[i] : b[i] + f[i];
        }
        memcpy(bank + (blk + 1) * td, b, sizeof(double) * td);
    }
    if (rc == 0) {
        memcpy(last_block, b, sizeof(double) * td);
        memcpy(last_h, h, sizeof(double) * td);
    }
    free(bank);
    free(b);
    free(h);
    free(f);
    return rc;
}

/* ---- the engine ---------------------------------------------------------- */

typedef struct engine {
    const model *m;
    attnres_plan *plans[K3_SITES];
    int levels[4]; /* plans per fallback level */
    double load_ms;
    /* Activations in storage dtype. */
    void *bank;  /* [K3_MAX_SOURCES][T][d]: b_0..b_8 */
    void *b;     /* [T][d] the block's running partial sum */
    void *f;     /* [T][d] the last sublayer output */
    void *h;     /* [T][d] the current site's mix output */
    void *o1;    /* [K3_SITES_PER_BLOCK][T][d] phase-1 outputs */
    float *lse;  /* [K3_SITES_PER_BLOCK][T] phase-1 log-sum-exp (H = 1) */
    double *scratch; /* [K3_MAX_SOURCES + 1][T][d] for the per-site check */
    double max_site_err;
    int worst_site;
} engine;

static size_t row_bytes(const model *m) { return (size_t)(m->T * m->d) * attnres_dtype_size(m->dtype); }
static void *bank_row(const engine *e, int i) { return (char *)e->bank + (size_t)i * row_bytes(e->m); }
static void *o1_row(const engine *e, int j) { return (char *)e->o1 + (size_t)j * row_bytes(e->m); }

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

/* Model load: plan every site. Returns 0 or the failing status. */
static int engine_load(engine *e, attnres_device *dev, attnres_db *db, unsigned flags, int quiet)
{
    const model *m = e->m;
    char msg[512];
    double t0 = now_ms();
    for (int s = 0; s < K3_SITES; s++) {
        attnres_problem p = k3_site_problem(m->form, m->dtype, m->d, s);
        int st = attnres_plan_create(dev, db, &p, flags, &e->plans[s], msg, sizeof msg);
        if (st != ATTNRES_OK) {
            fprintf(stderr, "k3_engine: planning site %d failed: %s (%s)\n", s, attnres_errstr(st), msg);
            return st;
        }
        e->levels[attnres_plan_level_get(e->plans[s])]++;
    }
    e->load_ms = now_ms() - t0;
    if (!quiet)
        printf("model load: %d plans in %.2f ms (%.1f us per site): %d exact, %d same architecture, "
               "%d same backend, %d built-in generic\n",
               K3_SITES, e->load_ms, 1e3 * e->load_ms / K3_SITES, e->levels[0], e->levels[1], e->levels[2],
               e->levels[3]);
    const size_t rb = row_bytes(m);
    e->bank = alloc64(rb * K3_MAX_SOURCES);
    e->b = alloc64(rb);
    e->f = alloc64(rb);
    e->h = alloc64(rb);
    e->o1 = alloc64(rb * K3_SITES_PER_BLOCK);
    e->lse = alloc64(sizeof(float) * (size_t)m->T * K3_SITES_PER_BLOCK);
    e->scratch = malloc(sizeof(double) * (size_t)(m->T * m->d) * (K3_MAX_SOURCES + 1));
    if (!e->bank || !e->b || !e->f || !e->h || !e->o1 || !e->lse || !e->scratch) {
        fprintf(stderr, "k3_engine: out of memory\n");
        return ATTNRES_ENOMEM;
    }
    return ATTNRES_OK;
}

static void engine_free(engine *e)
{
    for (int s = 0; s < K3_SITES; s++)
        attnres_plan_destroy(e->plans[s]);
    void *const bufs[] = {e->bank, e->b, e->f, e->h, e->o1, e->lse, e->scratch};
    free_each(bufs, sizeof bufs / sizeof bufs[0]);
}

/* Checks the output of site s against attnres_reference_mix of the inputs
 * the engine gave it: n storage rows, converted to fp64. */
static void check_site(engine *e, int s, const void *const *src, int n, const void *out)
{
    const model *m = e->m;
    const int64_t td = m->T * m->d;
    const double *rows[K3_MAX_SOURCES];
    for (int i = 0; i < n; i++) {
        double *r = e->scratch + i * td;
        for (int64_t k = 0; k < td; k++)
            r[k] = load(m->dtype, src[i], k);
        rows[i] = r;
    }
    double *ref = e->scratch + K3_MAX_SOURCES * td;
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, m->d, n);
    double err = INFINITY;
    if (attnres_reference_mix(&p, m->T, rows, m->u64 + s * m->d, 1.0, K3_EPS, NULL, 1.0, NULL, 1e-6, ref, NULL) ==
        ATTNRES_OK) {
        double num = 0, den = 0;
        for (int64_t k = 0; k < td; k++) {
            const double got = load(m->dtype, out, k);
            num += (got - ref[k]) * (got - ref[k]);
            den += ref[k] * ref[k];
        }
        err = den > 0 ? sqrt(num / den) : sqrt(num);
    }
    if (!(err <= e->max_site_err)) {
        e->max_site_err = err;
        e->worst_site = s;
    }
}

static int run_failed(const engine *e, int s, int st)
{
    fprintf(stderr, "k3_engine: site %d: %s: %s\n", s, attnres_errstr(st), attnres_plan_errmsg(e->plans[s]));
    return st;
}

/* One forward pass of the residual path. With check set, every site's
 * output is checked against the reference of its inputs. */
static int engine_forward(engine *e, int check)
{
    const model *m = e->m;
    const int64_t td = m->T * m->d;
    e->max_site_err = 0;
    e->worst_site = -1;
    for (int64_t i = 0; i < td; i++)
        store(m->dtype, e->bank, i, (float)m->embedding[i]);
    for (int blk = 0; blk < K3_BLOCKS; blk++) {
        const int first = k3_block_first(blk), sites = k3_block_sites(blk);
        const void *src[K3_MAX_SOURCES];
        for (int i = 0; i <= blk; i++)
            src[i] = bank_row(e, i);
        src[blk + 1] = e->b;
        if (m->form == K3_FORM_PHASE) {
            /* Phase 1: all sites of the block against b_0..b_blk at once. */
            void *o1[K3_SITES_PER_BLOCK];
            float *lse[K3_SITES_PER_BLOCK];
            for (int j = 0; j < sites; j++) {
                o1[j] = o1_row(e, j);
                lse[j] = e->lse + (size_t)j * (size_t)m->T;
            }
            attnres_phase1_args a1;
            attnres_phase1_args_init(&a1);
            a1.sources = src;
            a1.queries = m->u + (int64_t)first * m->d;
            a1.eps = K3_EPS;
            a1.o1 = o1;
            a1.lse = lse;
            int st = attnres_run_phase1(e->plans[first], m->T, &a1, NULL);
            if (st)
                return run_failed(e, first, st);
        }
        for (int j = 0; j < sites; j++) {
            const int s = first + j, n = blk + 1 + (j > 0);
            const void *out = e->h;
            int st;
            if (m->form == K3_FORM_MIX) {
                if (j >= 2) /* b += f of the previous sublayer */
                    for (int64_t i = 0; i < td; i++)
                        store(m->dtype, e->b, i, load(m->dtype, e->b, i) + load(m->dtype, e->f, i));
                attnres_mix_args a;
                attnres_mix_args_init(&a);
                a.sources = src;
                a.query = m->u + (int64_t)s * m->d;
                a.eps = K3_EPS;
                a.out = e->h;
                st = attnres_run_mix(e->plans[s], m->T, &a, NULL);
            } else if (j == 0) {
                out = o1_row(e, 0); /* the first site's input is o1 itself */
                st = ATTNRES_OK;
            } else {
                attnres_phase2_args a2;
                attnres_phase2_args_init(&a2);
                a2.o1 = o1_row(e, j);
                a2.lse = e->lse + (size_t)j * (size_t)m->T;
                a2.partial = e->b;
                a2.sublayer = e->f; /* with fused add (j >= 2): b += f first */
                a2.query = m->u + (int64_t)s * m->d;
                a2.eps = K3_EPS;
                a2.out = e->h;
                st = attnres_run_phase2(e->plans[s], m->T, &a2, NULL);
            }
            if (st)
                return run_failed(e, s, st);
            if (check)
                check_site(e, s, src, n, out);
            /* The sublayer; the first one's output starts the partial sum. */
            sublayer_storage(m, s, out, j == 0 ? e->b : e->f);
        }
        /* The block is complete: b plus its last sublayer's output is
         * b_(blk+1) (a one-site block has it in b already). */
        if (sites == 1)
            memcpy(bank_row(e, blk + 1), e->b, row_bytes(m));
        else
            for (int64_t i = 0; i < td; i++)
                store(m->dtype, bank_row(e, blk + 1), i, load(m->dtype, e->b, i) + load(m->dtype, e->f, i));
    }
    return ATTNRES_OK;
}

/* ---- the training step ----------------------------------------------------- */

/* The sites a training step trains: each block's first site, whose sources
 * b_0..b_blk all sit in the bank once the forward pass is done, and the
 * model's last site, whose partial sum the pass leaves in b. Together they
 * take N = 1..9 sources, N = 1 included (whose query gradient is zero). */
#define K3_TRAIN_SITES (K3_BLOCKS + 1)

static int train_site(int i) { return i < K3_BLOCKS ? k3_block_first(i) : K3_SITES - 1; }
static int train_sources(int i) { return i < K3_BLOCKS ? i + 1 : K3_MAX_SOURCES; }

typedef struct trainer {
    attnres_plan *fwd[K3_TRAIN_SITES]; /* op ATTNRES_OP_MIX */
    attnres_plan *bwd[K3_TRAIN_SITES]; /* op ATTNRES_OP_MIX_BACKWARD */
    int levels[4];                     /* backward plans per fallback level */
    void *workspace;                   /* the backward's, sized at load for T */
    size_t workspace_size;
    double *target;                    /* [T][d] the loss's fixed target y */
    void *out, *dout;                  /* [T][d] storage: the site's mix, dL/dout */
    void *dsrc;                        /* [K3_MAX_SOURCES][T][d] storage: dL/dv_n */
    float *dquery, *dw, *dg;           /* [d] */
    double *src64, *dsrc64;            /* [K3_MAX_SOURCES][T][d] the reference's */
    double *dout64;                    /* [T][d] */
    double *dq64, *w64, *g64, *dw64, *dg64; /* [d] */
    double *dwg64;                     /* [2][d] the library's dw and dg in fp64 */
} trainer;

static void trainer_free(trainer *t)
{
    for (int i = 0; i < K3_TRAIN_SITES; i++) {
        attnres_plan_destroy(t->fwd[i]);
        attnres_plan_destroy(t->bwd[i]);
    }
    void *const bufs[] = {t->workspace, t->target, t->out, t->dout, t->dsrc, t->dquery, t->dw, t->dg,
                          t->src64, t->dsrc64, t->dout64, t->dq64, t->w64, t->g64, t->dw64, t->dg64,
                          t->dwg64};
    free_each(bufs, sizeof bufs / sizeof bufs[0]);
}

/* Training load: a forward and a backward plan per trained site, and the
 * backward's workspace, asked for once for the largest T a step runs, so
 * that a step allocates nothing. Returns 0 or the failing status. */
static int trainer_load(trainer *t, const model *m, attnres_device *dev, attnres_db *db, unsigned flags,
                        int quiet)
{
    char msg[512];
    for (int i = 0; i < K3_TRAIN_SITES; i++) {
        attnres_problem p;
        attnres_problem_init(&p, m->dtype, m->d, train_sources(i));
        int st = attnres_plan_create(dev, db, &p, flags, &t->fwd[i], msg, sizeof msg);
        if (st == ATTNRES_OK) {
            p.op = ATTNRES_OP_MIX_BACKWARD;
            st = attnres_plan_create(dev, db, &p, flags, &t->bwd[i], msg, sizeof msg);
        }
        if (st != ATTNRES_OK) {
            fprintf(stderr, "k3_engine: planning the training of site %d failed: %s (%s)\n", train_site(i),
                    attnres_errstr(st), msg);
            return st;
        }
        t->levels[attnres_plan_level_get(t->bwd[i])]++;
        size_t bytes = 0;
        st = attnres_mix_backward_workspace_size(t->bwd[i], m->T, &bytes);
        if (st != ATTNRES_OK) {
            fprintf(stderr, "k3_engine: workspace of site %d: %s (%s)\n", train_site(i), attnres_errstr(st),
                    attnres_plan_errmsg(t->bwd[i]));
            return st;
        }
        if (bytes > t->workspace_size)
            t->workspace_size = bytes;
    }
    const int64_t td = m->T * m->d;
    const size_t es = attnres_dtype_size(m->dtype);
    t->workspace = alloc64(t->workspace_size);
    t->target = malloc(sizeof(double) * td);
    t->out = alloc64(es * td);
    t->dout = alloc64(es * td);
    t->dsrc = alloc64(es * td * K3_MAX_SOURCES);
    t->dquery = malloc(sizeof(float) * m->d);
    t->dw = malloc(sizeof(float) * m->d);
    t->dg = malloc(sizeof(float) * m->d);
    t->src64 = malloc(sizeof(double) * td * K3_MAX_SOURCES);
    t->dsrc64 = malloc(sizeof(double) * td * K3_MAX_SOURCES);
    t->dout64 = malloc(sizeof(double) * td);
    t->dq64 = malloc(sizeof(double) * m->d);
    t->w64 = malloc(sizeof(double) * m->d);
    t->g64 = malloc(sizeof(double) * m->d);
    t->dw64 = malloc(sizeof(double) * m->d);
    t->dg64 = malloc(sizeof(double) * m->d);
    t->dwg64 = malloc(sizeof(double) * 2 * m->d);
    if (!t->workspace || !t->target || !t->out || !t->dout || !t->dsrc || !t->dquery || !t->dw || !t->dg ||
        !t->src64 || !t->dsrc64 || !t->dout64 || !t->dq64 || !t->w64 || !t->g64 || !t->dw64 || !t->dg64 ||
        !t->dwg64) {
        fprintf(stderr, "k3_engine: out of memory\n");
        return ATTNRES_ENOMEM;
    }
    for (int64_t i = 0; i < td; i++)
        t->target[i] = rng_normal();
    if (!quiet)
        printf("training load: %d sites, a forward and a backward plan each; backward plans: %d exact, "
               "%d same architecture, %d same backend, %d built-in generic; workspace %zu bytes for T = %lld\n",
               K3_TRAIN_SITES, t->levels[0], t->levels[1], t->levels[2], t->levels[3], t->workspace_size,
               (long long)m->T);
    return ATTNRES_OK;
}

/* What a training step found: its loss and each gradient's worst relative
 * error against the fp64 reference, with the site where it was worst. */
typedef struct train_report {
    double loss, bwd_ms;
    double err[3]; /* dv, dw, dg */
    int worst[3];
} train_report;

static void note_err(train_report *r, int which, double err, int site)
{
    if (!(err <= r->err[which])) {
        r->err[which] = err;
        r->worst[which] = site;
    }
}

static int train_failed(attnres_plan *plan, int s, const char *what, int st)
{
    fprintf(stderr, "k3_engine: training site %d: %s: %s: %s\n", s, what, attnres_errstr(st), attnres_plan_errmsg(plan));
    return st;
}

/* One training step over the trained sites, after a forward pass of the
 * engine: per site, the mix forward on the sources the pass left, the loss
 * L = 0.5 |out - y|^2 against the fixed target y, its gradient dL/dout =
 * out - y, the backward, and the parameter gradients dw = du * g and dg =
 * du * w from the gradient du of the folded query. Every gradient is then
 * checked against attnres_reference_mix_backward of the very inputs the
 * library got (sources and dL/dout as stored, converted to fp64). */
static int engine_train_step(engine *e, trainer *t, train_report *r)
{
    const model *m = e->m;
    const int64_t d = m->d, td = m->T * d;
    memset(r, 0, sizeof *r);
    for (int w = 0; w < 3; w++)
        r->worst[w] = -1;
    for (int i = 0; i < K3_TRAIN_SITES; i++) {
        const int s = train_site(i), n = train_sources(i);
        const void *src[K3_MAX_SOURCES];
        void *dsrc[K3_MAX_SOURCES];
        for (int j = 0; j < n; j++) {
            src[j] = i == K3_BLOCKS && j == n - 1 ? e->b : bank_row(e, j);
            dsrc[j] = (char *)t->dsrc + (size_t)j * row_bytes(m);
        }

        attnres_mix_args a;
        attnres_mix_args_init(&a);
        a.sources = src;
        a.query = m->u + s * d;
        a.eps = K3_EPS;
        a.out = t->out;
        int st = attnres_run_mix(t->fwd[i], m->T, &a, NULL);
        if (st)
            return train_failed(t->fwd[i], s, "forward", st);
        for (int64_t k = 0; k < td; k++) {
            const double diff = load(m->dtype, t->out, k) - t->target[k];
            r->loss += 0.5 * diff * diff;
            store(m->dtype, t->dout, k, (float)diff);
        }

        attnres_mix_backward_args b;
        attnres_mix_backward_args_init(&b);
        b.sources = src;
        b.query = m->u + s * d;
        b.eps = K3_EPS;
        b.dout = t->dout;
        b.dsources = dsrc;
        b.dquery = t->dquery;
        b.workspace = t->workspace;
        b.workspace_size = t->workspace_size;
        const double t0 = now_ms();
        st = attnres_run_mix_backward(t->bwd[i], m->T, &b, NULL);
        r->bwd_ms += now_ms() - t0;
        if (st)
            return train_failed(t->bwd[i], s, "backward", st);
        const float *w = m->w + s * d, *g = m->g + s * d;
        for (int64_t k = 0; k < d; k++) {
            t->dw[k] = t->dquery[k] * g[k];
            t->dg[k] = t->dquery[k] * w[k];
        }

        const double *rows[K3_MAX_SOURCES];
        double *drows[K3_MAX_SOURCES];
        for (int j = 0; j < n; j++) {
            double *row = t->src64 + j * td;
            for (int64_t k = 0; k < td; k++)
                row[k] = load(m->dtype, src[j], k);
            rows[j] = row;
            drows[j] = t->dsrc64 + j * td;
        }
        for (int64_t k = 0; k < td; k++)
            t->dout64[k] = load(m->dtype, t->dout, k);
        for (int64_t k = 0; k < d; k++) {
            t->w64[k] = w[k];
            t->g64[k] = g[k];
        }
        attnres_problem p;
        attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, n);
        char msg[256];
        st = attnres_reference_mix_backward(&p, m->T, rows, m->u64 + s * d, 1.0, K3_EPS, NULL, 1.0, NULL, 1e-6,
                                            t->dout64, NULL, 0, drows, t->dq64, NULL, NULL, NULL, msg, sizeof msg);
        if (st == ATTNRES_OK)
            st = attnres_reference_fold_query_backward(t->dq64, t->w64, t->g64, d, t->dw64, t->dg64, msg,
                                                       sizeof msg);
        if (st) {
            fprintf(stderr, "k3_engine: training site %d: reference: %s (%s)\n", s, attnres_errstr(st), msg);
            return st;
        }

        /* The reference has read the source copies: they take the
         * library's gradients, converted to fp64, now. */
        for (int j = 0; j < n; j++) {
            double *got = t->src64 + j * td;
            for (int64_t k = 0; k < td; k++)
                got[k] = load(m->dtype, dsrc[j], k);
            note_err(r, 0, rel_err(got, drows[j], td), s);
        }
        for (int64_t k = 0; k < d; k++) {
            t->dwg64[k] = t->dw[k];
            t->dwg64[d + k] = t->dg[k];
        }
        note_err(r, 1, rel_err(t->dwg64, t->dw64, d), s);
        note_err(r, 2, rel_err(t->dwg64 + d, t->dg64, d), s);
    }
    return ATTNRES_OK;
}

/* ---- main ------------------------------------------------------------------ */

static int usage(void)
{
    fprintf(stderr, "usage: k3_engine [--device cpu] [--db FILE] [--form phase|mix] [--dtype f32|bf16] [--d D]\n"
                    "                 [--tokens T] [--train] [--require-exact] [--explain SITE] [--quiet]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *dbpath = NULL, *device = "cpu";
    model m = {.d = 256, .T = 4, .dtype = ATTNRES_DTYPE_F32, .form = K3_FORM_PHASE};
    unsigned flags = 0;
    int quiet = 0, explain_site = -1, train = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--require-exact")) {
            flags |= ATTNRES_PLAN_REQUIRE_EXACT;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--train")) {
            train = 1;
        } else if (!v) {
            return usage();
        } else if (!strcmp(a, "--db")) {
            dbpath = argv[++i];
        } else if (!strcmp(a, "--device")) {
            device = argv[++i];
        } else if (!strcmp(a, "--form")) {
            if (strcmp(v, "phase") && strcmp(v, "mix"))
                return usage();
            m.form = strcmp(argv[++i], "mix") ? K3_FORM_PHASE : K3_FORM_MIX;
        } else if (!strcmp(a, "--dtype")) {
            if (attnres_dtype_parse(argv[++i], &m.dtype) || m.dtype == ATTNRES_DTYPE_F16)
                return usage();
        } else if (!strcmp(a, "--d")) {
            m.d = strtoll(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--tokens")) {
            m.T = strtoll(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--explain")) {
            explain_site = atoi(argv[++i]);
        } else {
            return usage();
        }
    }
    if (m.d < 1 || m.d > 65536 || m.T < 1 || m.T > 65536 || explain_site >= K3_SITES)
        return usage();
    if (strcmp(device, "cpu") != 0) {
        fprintf(stderr, "k3_engine: this example keeps activations in host memory: --device cpu only\n");
        return 2;
    }
    if (!quiet)
        printf("k3_engine: libattnres %s (header %s); K3-shaped Block AttnRes: %d layers, blocks of %d, %d sites, "
               "d = %lld, T = %lld, %s, %s form\n",
               attnres_version(), ATTNRES_VERSION_STRING, K3_LAYERS, K3_LAYERS_PER_BLOCK, K3_SITES,
               (long long)m.d, (long long)m.T, attnres_dtype_name(m.dtype),
               m.form == K3_FORM_PHASE ? "two-phase" : "mix");
    if (model_init(&m)) {
        fprintf(stderr, "k3_engine: out of memory\n");
        model_free(&m);
        return 1;
    }
    int code = 1;
    char msg[512];
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    engine e = {.m = &m};
    trainer tr = {0};
    int st = attnres_device_open(device, &dev, msg, sizeof msg);
    if (st) {
        fprintf(stderr, "k3_engine: cannot open device %s: %s (%s)\n", device, attnres_errstr(st), msg);
        goto done;
    }
    if (dbpath && (st = attnres_db_open(dbpath, &db, msg, sizeof msg))) {
        fprintf(stderr, "k3_engine: cannot open database %s: %s (%s)\n", dbpath, attnres_errstr(st), msg);
        goto done;
    }
    if (engine_load(&e, dev, db, flags, quiet))
        goto done;
    if (train && trainer_load(&tr, &m, dev, db, flags, quiet))
        goto done;
    attnres_db_close(db); /* plans keep nothing of the database */
    db = NULL;
    if (explain_site >= 0) {
        char text[8192];
        attnres_plan_explain(e.plans[explain_site], text, sizeof text);
        printf("plan of site %d:\n%s", explain_site, text);
    }

    double t0 = now_ms();
    if (engine_forward(&e, 0)) /* timed, unchecked */
        goto done;
    const double fwd_ms = now_ms() - t0;
    if (engine_forward(&e, 1))
        goto done;

    const int64_t td = m.T * m.d;
    double *ref_b = malloc(sizeof(double) * td), *ref_h = malloc(sizeof(double) * td);
    double *got_b = malloc(sizeof(double) * td), *got_h = malloc(sizeof(double) * td);
    if (!ref_b || !ref_h || !got_b || !got_h || forward_reference(&m, ref_b, ref_h)) {
        fprintf(stderr, "k3_engine: out of memory for the reference\n");
    } else {
        for (int64_t i = 0; i < td; i++) {
            got_b[i] = load(m.dtype, bank_row(&e, K3_BLOCKS), i);
            got_h[i] = load(m.dtype, e.h, i);
        }
        const double site_tol = m.dtype == ATTNRES_DTYPE_F32 ? 1e-5 : 1e-2;
        const double e2e_tol = m.dtype == ATTNRES_DTYPE_F32 ? 1e-4 : 2e-1; /* bf16 drifts over 186 sites */
        const double e2e_b = rel_err(got_b, ref_b, td), e2e_h = rel_err(got_h, ref_h, td);
        int pass = e.max_site_err <= site_tol && e2e_b <= e2e_tol && e2e_h <= e2e_tol;
        if (!quiet || !pass) {
            printf("forward: %d sites in %.3f ms (%.2f us per site, toy sublayers included)\n", K3_SITES, fwd_ms,
                   1e3 * fwd_ms / K3_SITES);
            printf("check: per-site max rel err %.2e at site %d (tolerance %.0e); end to end vs fp64 forward: "
                   "final block %.2e, last site %.2e (tolerance %.0e)\n",
                   e.max_site_err, e.worst_site, site_tol, e2e_b, e2e_h, e2e_tol);
        }
        if (train) {
            /* The gradients have the forward's tolerance (DESIGN §1b), each on its own. */
            train_report r;
            const int ran = engine_train_step(&e, &tr, &r) == ATTNRES_OK;
            const int train_pass = ran && r.err[0] <= site_tol && r.err[1] <= site_tol && r.err[2] <= site_tol;
            if (ran && (!quiet || !train_pass)) {
                printf("train: %d sites (N = 1..%d), loss 0.5 |out - y|^2 = %.6g, backward %.3f ms\n",
                       K3_TRAIN_SITES, K3_MAX_SOURCES, r.loss, r.bwd_ms);
                printf("gradient check vs fp64 reference: dv %.2e (site %d), dw %.2e (site %d), dg %.2e (site %d) "
                       "(tolerance %.0e)\n",
                       r.err[0], r.worst[0], r.err[1], r.worst[1], r.err[2], r.worst[2], site_tol);
            }
            pass = pass && train_pass;
        }
        printf("%s\n", pass ? "PASS" : "FAIL");
        code = pass ? 0 : 1;
    }
    free(ref_b);
    free(ref_h);
    free(got_b);
    free(got_h);
done:
    trainer_free(&tr);
    engine_free(&e);
    attnres_db_close(db);
    attnres_device_close(dev);
    model_free(&m);
    return code;
}
