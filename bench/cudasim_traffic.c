/*
 * cudasim_traffic.c - memory traffic of the default CUDA variants on the K3
 * and MHAR-8B shapes, counted by the simulated driver, against the cost
 * model's minimal traffic (DESIGN §2). Run by bench/cudasim_traffic.sh.
 *
 * For every variant of cuda/mix_online, cuda/mix_twopass, cuda/phase1,
 * cuda/phase2, cuda/mix_backward, cuda/phase1_backward and
 * cuda/phase2_backward that its template marks as default (launch data
 * "default":1), plus each template's generic kernel (cuda/mix_online has
 * none), at the shapes' storage dtype (bf16): the emitted source is
 * compiled by NVRTC to PTX, loaded and launched through the CUDA backend's
 * own operations (as the tuner does), for every problem below that the
 * variant's applies() accepts, at each T asked for. The counters are the
 * simulator's (cudasimTakeTraffic of the driver library the backend
 * loaded, summed over the launch's kernels: each backward's two):
 * warp-level requests, 32-byte sectors per request, distinct sectors read
 * and written (the DRAM traffic of an ideal cache, per kernel).
 *
 * Problems (bf16, replace form, no epilogue):
 *   K3       d = 7168, H = 1;  MHAR-8B  d = 4096, H = 8;  for each:
 *   mix      N = 9 sources;
 *   phase1   n = 8 block representations, S = 24 sites (the k3 preset of
 *            tuner/src/problems.c: blocks of 12 layers);
 *   phase2   with the fused add (b += f) and without (the k3 preset's two);
 *   mix_backward  N = 9 sources, the source gradients written in bf16;
 *   phase1_backward  phase1's n and S, the source gradients written in
 *            bf16; every site but the first has a dlse (the block's first
 *            site has no phase 2, so its dlse pointer is NULL: zero);
 *   phase2_backward  with the fused add (dsublayer written too) and
 *            without.
 * Buffers are contiguous rows (stride d), one allocation per source, site
 * output or lse (or their gradients), as an engine keeps them; outputs
 * start as NaN and must come back with no NaN (every element written),
 * inputs are finite. No backward accumulates (flags 0).
 *
 * Minimal traffic (DESIGN §2), storage bytes:
 *   mix      read N*T*d,                 write T*d;
 *   phase1   read n*T*d,                 write S*T*d (o1) + S*T*H*4 (lse);
 *   phase2   read 2*T*d (o1, b) + T*H*4 (lse) [+ T*d f when fused],
 *            write T*d [+ T*d b when fused];
 *   mix_backward  read N*T*d + 2*T*d (sources, out, dout) + T*H*4 (lse),
 *            write N*T*d (the source gradients). The kernels read neither
 *            out nor lse (they recompute the weights from the sources
 *            they read anyway), so they can move less than this;
 *   phase1_backward  read (n + S)*T*d (sources, do1) + S'*T*H*4 (dlse of
 *            the S' = S - 1 sites that have one), write n*T*d (the source
 *            gradients);
 *   phase2_backward  read 3*T*d (o1, b, dout) + T*H*4 (lse), write 2*T*d
 *            (do1, db) [+ T*d dsublayer when fused] + T*H*4 (dlse).
 * DESIGN §2 states the phase backwards' per-token traffic in words;
 * tuner/src/problems.c (problem_traffic) has the same in bytes, except
 * that it counts the dlse of all S sites.
 * The fp32 pseudo-queries (d floats, S*d for phase 1) are parameters that
 * DESIGN §2 does not count; they are reported apart ("apart"), and for
 * the backwards with them the queries' gradients (d floats written, S*d
 * for phase 1) and the token groups' fp32 partial rows of the workspace,
 * which the second kernel reads back (ceil(T / 32) * d * 4 bytes each way,
 * S*d per row for phase 1). A group's later tokens also read back the rows
 * its first token wrote; the first kernel's counters count that read too,
 * so at T > 1 a backward can move one workspace's bytes more than this.
 *
 * Prints one markdown table on stdout (rows by op, problem, variant, T) and
 * the default variants applies() refused, with its reason; progress on
 * stderr. Columns: warp-level requests; sectors per request, next to the
 * ideal for the variant's access width (its "align" bytes per lane x 32
 * lanes / 32-byte sectors: a 16-byte load touches 16) and to the bytes the
 * lanes asked for per request / 32 (the sectors of a perfectly coalesced
 * request of that size); distinct bytes read and written; the minimal
 * traffic; (read + written) / minimal, without and with the bytes reported
 * apart (the query, and the backwards' query gradients and workspace); the
 * sectors summed over requests x 32 B (what the SMs pull through L1/L2 when
 * nothing hits in L1: re-reads and uncoalesced lanes show here, not in the
 * distinct bytes) over the minimal.
 *
 *   cudasim_traffic [--tokens 8,1] [--only SUBSTRING]
 *
 * Needs ATTNRES_CUDA_DRIVER naming libattnres-cudasim.so (the counters come
 * from it) and NVRTC. Exit 0 when every run launched and wrote its outputs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argen.h"
#include "attnres.h"
#include "cudasim.h"
#include "device.h"
#include "nvrtc.h"
#include "storage_convert.h"

#ifndef ATTNRES_TEMPLATE_DIR
#define ATTNRES_TEMPLATE_DIR "templates"
#endif

typedef struct shape {
    const char *name;
    int64_t d;
    int heads;
} shape;

static const shape shapes[] = {{"K3", 7168, 1}, {"MHAR-8B", 4096, 8}};
enum { MIX_N = 9, P1_N = 8, P1_S = 24, MAX_T = 64 };

static attnres_device *dev;
static int (*take_traffic)(cudasim_traffic *);
static int failures;

/* ---- buffers ----------------------------------------------------------- */

static uint64_t rng = 0x7261666669637ull;

static float uniform(float lo, float hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((rng >> 40) * 0x1.0p-24);
}

enum fill { POISON, BF16_RANDOM, F32_RANDOM };

/* Every allocation of the current run, freed together. */
static void *allocs[128];
static int nallocs;

/* A device buffer of `bytes`: NaN (0xff bytes), random bf16 in [-1, 1), or
 * random fp32 in [lo, hi). NULL on failure (reported). */
static void *dbuf(size_t bytes, enum fill f, float lo, float hi)
{
    unsigned char *host = malloc(bytes);
    void *p = NULL;
    if (!host || nallocs == (int)(sizeof allocs / sizeof allocs[0])) {
        fprintf(stderr, "out of host memory\n");
        free(host);
        return NULL;
    }
    memset(host, 0xff, bytes);
    if (f == BF16_RANDOM)
        for (size_t i = 0; i < bytes / 2; i++)
            ((uint16_t *)host)[i] = ar_bf16_from_f32(uniform(-1.0f, 1.0f));
    else if (f == F32_RANDOM)
        for (size_t i = 0; i < bytes / 4; i++)
            ((float *)host)[i] = uniform(lo, hi);
    if (dev->ops->mem_alloc(dev, bytes, &p) != ATTNRES_OK ||
        dev->ops->copy_to_device(dev, p, host, bytes) != ATTNRES_OK) {
        fprintf(stderr, "device buffer of %zu bytes: %s\n", bytes, attnres_device_errmsg(dev));
        if (p)
            dev->ops->mem_free(dev, p);
        p = NULL;
    } else {
        allocs[nallocs++] = p;
    }
    free(host);
    return p;
}

static void free_all(void)
{
    for (int i = 0; i < nallocs; i++)
        dev->ops->mem_free(dev, allocs[i]);
    nallocs = 0;
}

/* Number of NaN elements in an output buffer (bf16 or fp32); -1 when it
 * could not be copied back (the launch faulted). */
static int64_t nan_count(const void *p, size_t bytes, int f32)
{
    unsigned char *h = malloc(bytes);
    int64_t nan = 0;
    if (!h || dev->ops->copy_to_host(dev, h, p, bytes) != ATTNRES_OK) {
        free(h);
        return -1;
    }
    if (f32) {
        for (size_t i = 0; i < bytes / 4; i++)
            nan += isnan(((float *)h)[i]) != 0;
    } else {
        for (size_t i = 0; i < bytes / 2; i++)
            nan += (((uint16_t *)h)[i] & 0x7fffu) > 0x7f80u;
    }
    free(h);
    return nan;
}

/* ---- one run ----------------------------------------------------------- */

typedef struct minimal {
    double read, write, query; /* bytes */
} minimal;

/* Launches k on problem p at T with fresh buffers; checks every output was
 * written. 0 on success, with the minimal traffic in *m. */
static int run_one(const ar_kernel *k, const attnres_problem *p, int64_t T, minimal *m)
{
    const size_t es = attnres_dtype_size(p->dtype), row = (size_t)(T * p->d) * es, d4 = (size_t)p->d * 4;
    const size_t lse_bytes = (size_t)(T * p->heads) * 4;
    const float qs = 3.0f / sqrtf((float)p->d);
    void *outs[64];
    size_t out_bytes[64];
    int outs_f32[64], nout = 0, rc = ATTNRES_OK;
    nallocs = 0;
#define NEED(x)                                                                                                   \
    do {                                                                                                          \
        if (!(x)) {                                                                                               \
            free_all();                                                                                           \
            return -1;                                                                                            \
        }                                                                                                         \
    } while (0)
#define OUT(ptr, bytes, f32) (outs[nout] = (ptr), out_bytes[nout] = (bytes), outs_f32[nout++] = (f32))
    /* Each branch fills its op's arguments and op, which points at them, so
     * they live until the one launch after the branches. */
    const void *src[MIX_N > P1_N ? MIX_N : P1_N];
    void *o1[P1_S];
    float *lse[P1_S];
    attnres_mix_args ma;
    attnres_phase1_args p1a;
    attnres_phase2_args p2a;
    attnres_mix_backward_args mba;
    attnres_phase1_backward_args p1b;
    attnres_phase2_backward_args p2b;
    void *dsrc[MIX_N];
    const void *do1[P1_S];
    const float *dlse[P1_S];
    ar_op_args op;
    if (p->op == ATTNRES_OP_MIX) {
        for (int i = 0; i < p->n; i++)
            NEED(src[i] = dbuf(row, BF16_RANDOM, 0, 0));
        attnres_mix_args *const a = &ma;
        attnres_mix_args_init(a);
        a->sources = src;
        NEED(a->query = dbuf(d4, F32_RANDOM, -qs, qs));
        NEED(a->out = dbuf(row, POISON, 0, 0));
        a->eps = 1e-5f;
        OUT(a->out, row, 0);
        op = ar_op_mix(a);
        *m = (minimal){(double)p->n * row, (double)row, (double)d4};
    } else if (p->op == ATTNRES_OP_PHASE1) {
        for (int i = 0; i < p->n; i++)
            NEED(src[i] = dbuf(row, BF16_RANDOM, 0, 0));
        for (int j = 0; j < p->s; j++) {
            NEED(o1[j] = dbuf(row, POISON, 0, 0));
            NEED(lse[j] = dbuf(lse_bytes, POISON, 0, 0));
            OUT(o1[j], row, 0);
            OUT(lse[j], lse_bytes, 1);
        }
        attnres_phase1_args *const a = &p1a;
        attnres_phase1_args_init(a);
        a->sources = src;
        NEED(a->queries = dbuf((size_t)p->s * d4, F32_RANDOM, -qs, qs));
        a->o1 = o1;
        a->lse = lse;
        a->eps = 1e-5f;
        op = ar_op_phase1(a);
        *m = (minimal){(double)p->n * row, (double)p->s * (row + lse_bytes), (double)p->s * d4};
    } else if (p->op == ATTNRES_OP_MIX_BACKWARD) {
        for (int i = 0; i < p->n; i++) {
            NEED(src[i] = dbuf(row, BF16_RANDOM, 0, 0));
            NEED(dsrc[i] = dbuf(row, POISON, 0, 0));
            OUT(dsrc[i], row, 0);
        }
        attnres_mix_backward_args *const a = &mba;
        attnres_mix_backward_args_init(a);
        a->sources = src;
        NEED(a->query = dbuf(d4, F32_RANDOM, -qs, qs));
        NEED(a->dout = dbuf(row, BF16_RANDOM, 0, 0));
        a->dsources = dsrc;
        NEED(a->dquery = dbuf(d4, POISON, 0, 0));
        OUT(a->dquery, d4, 1);
        ar_backward_ws layout;
        NEED(ar_mix_backward_workspace(p->d, T, 0, &layout) == 0);
        const size_t ws = layout.bytes;
        NEED(a->workspace = dbuf(ws, POISON, 0, 0));
        a->workspace_size = ws;
        a->eps = 1e-5f;
        op = ar_op_mix_backward(a);
        *m = (minimal){(p->n + 2.0) * row + lse_bytes, (double)p->n * row, 2.0 * d4 + 2.0 * (double)ws};
    } else if (p->op == ATTNRES_OP_PHASE1_BACKWARD) {
        for (int i = 0; i < p->n; i++) {
            NEED(src[i] = dbuf(row, BF16_RANDOM, 0, 0));
            NEED(dsrc[i] = dbuf(row, POISON, 0, 0));
            OUT(dsrc[i], row, 0);
        }
        /* A block's first site has no phase 2, so no gradient of its lse. */
        for (int j = 0; j < p->s; j++) {
            NEED(do1[j] = dbuf(row, BF16_RANDOM, 0, 0));
            dlse[j] = NULL;
            if (j > 0)
                NEED(dlse[j] = dbuf(lse_bytes, F32_RANDOM, -0.5f, 0.5f));
        }
        attnres_phase1_backward_args *const a = &p1b;
        attnres_phase1_backward_args_init(a);
        a->sources = src;
        NEED(a->queries = dbuf((size_t)p->s * d4, F32_RANDOM, -qs, qs));
        a->do1 = do1;
        a->dlse = dlse;
        a->dsources = dsrc;
        NEED(a->dqueries = dbuf((size_t)p->s * d4, POISON, 0, 0));
        OUT(a->dqueries, (size_t)p->s * d4, 1);
        /* The runtime's layout: one row of S * d floats per token group. */
        ar_backward_ws layout;
        NEED(ar_mix_backward_workspace(p->d * p->s, T, 0, &layout) == 0);
        const size_t ws = layout.bytes;
        NEED(a->workspace = dbuf(ws, POISON, 0, 0));
        a->workspace_size = ws;
        a->eps = 1e-5f;
        op = ar_op_phase1_backward(a);
        *m = (minimal){(double)(p->n + p->s) * row + (p->s - 1.0) * lse_bytes, (double)p->n * row,
                       2.0 * p->s * d4 + 2.0 * (double)ws};
    } else if (p->op == ATTNRES_OP_PHASE2_BACKWARD) {
        attnres_phase2_backward_args *const a = &p2b;
        attnres_phase2_backward_args_init(a);
        NEED(a->o1 = dbuf(row, BF16_RANDOM, 0, 0));
        NEED(a->lse = dbuf(lse_bytes, F32_RANDOM, -0.5f, 3.5f));
        NEED(a->partial = dbuf(row, BF16_RANDOM, 0, 0));
        NEED(a->query = dbuf(d4, F32_RANDOM, -qs, qs));
        NEED(a->dout = dbuf(row, BF16_RANDOM, 0, 0));
        NEED(a->do1 = dbuf(row, POISON, 0, 0));
        OUT(a->do1, row, 0);
        NEED(a->dlse = dbuf(lse_bytes, POISON, 0, 0));
        OUT(a->dlse, lse_bytes, 1);
        NEED(a->dpartial = dbuf(row, POISON, 0, 0));
        OUT(a->dpartial, row, 0);
        if (p->fuse_add) {
            NEED(a->dsublayer = dbuf(row, POISON, 0, 0));
            OUT(a->dsublayer, row, 0);
        }
        NEED(a->dquery = dbuf(d4, POISON, 0, 0));
        OUT(a->dquery, d4, 1);
        ar_backward_ws layout;
        NEED(ar_mix_backward_workspace(p->d, T, 0, &layout) == 0);
        const size_t ws = layout.bytes;
        NEED(a->workspace = dbuf(ws, POISON, 0, 0));
        a->workspace_size = ws;
        a->eps = 1e-5f;
        op = ar_op_phase2_backward(a);
        *m = (minimal){3.0 * row + lse_bytes, (2.0 + p->fuse_add) * row + lse_bytes, 2.0 * d4 + 2.0 * (double)ws};
    } else {
        attnres_phase2_args *const a = &p2a;
        attnres_phase2_args_init(a);
        NEED(a->o1 = dbuf(row, BF16_RANDOM, 0, 0));
        NEED(a->lse = dbuf(lse_bytes, F32_RANDOM, -0.5f, 3.5f));
        NEED(a->partial = dbuf(row, BF16_RANDOM, 0, 0));
        if (p->fuse_add) {
            NEED(a->sublayer = dbuf(row, BF16_RANDOM, 0, 0));
            OUT(a->partial, row, 0);
        }
        NEED(a->query = dbuf(d4, F32_RANDOM, -qs, qs));
        NEED(a->out = dbuf(row, POISON, 0, 0));
        a->eps = 1e-5f;
        OUT(a->out, row, 0);
        op = ar_op_phase2(a);
        *m = (minimal){(2.0 + p->fuse_add) * row + lse_bytes, (1.0 + p->fuse_add) * row, (double)d4};
    }
    cudasim_traffic before;
    take_traffic(&before); /* from zero for this launch */
    rc = dev->ops->launch(dev, k, p, T, &op, NULL);
#undef NEED
#undef OUT
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "  launch: %s\n", attnres_device_errmsg(dev));
        free_all();
        return -1;
    }
    for (int i = 0; i < nout; i++) {
        int64_t nan = nan_count(outs[i], out_bytes[i], outs_f32[i]);
        if (nan != 0) {
            if (nan < 0)
                fprintf(stderr, "  copying an output back: %s\n", attnres_device_errmsg(dev));
            else
                fprintf(stderr, "  output %d: %lld element(s) left unwritten (NaN)\n", i, (long long)nan);
            free_all();
            return -1;
        }
    }
    free_all();
    return 0;
}

/* ---- the sweep --------------------------------------------------------- */

typedef struct problem {
    const shape *sh;
    attnres_problem p;
    char label[64];
} problem;

static int problems_of(const char *op, const shape *sh, problem out[2])
{
    int n = 0;
    for (int fuse = 1; fuse >= 0; fuse--) {
        problem *pr = &out[n];
        pr->sh = sh;
        attnres_problem_init(&pr->p, ATTNRES_DTYPE_BF16, sh->d, MIX_N);
        pr->p.heads = sh->heads;
        if (strcmp(op, "mix") == 0) {
            snprintf(pr->label, sizeof pr->label, "%s mix N=%d", sh->name, MIX_N);
            return 1;
        }
        if (strcmp(op, "mix_backward") == 0) {
            pr->p.op = ATTNRES_OP_MIX_BACKWARD;
            snprintf(pr->label, sizeof pr->label, "%s mix_backward N=%d", sh->name, MIX_N);
            return 1;
        }
        if (strcmp(op, "phase1") == 0) {
            pr->p.op = ATTNRES_OP_PHASE1;
            pr->p.n = P1_N;
            pr->p.s = P1_S;
            snprintf(pr->label, sizeof pr->label, "%s phase1 n=%d S=%d", sh->name, P1_N, P1_S);
            return 1;
        }
        if (strcmp(op, "phase1_backward") == 0) {
            pr->p.op = ATTNRES_OP_PHASE1_BACKWARD;
            pr->p.n = P1_N;
            pr->p.s = P1_S;
            snprintf(pr->label, sizeof pr->label, "%s phase1_backward n=%d S=%d, dlse at %d", sh->name, P1_N, P1_S,
                     P1_S - 1);
            return 1;
        }
        const int backward = strcmp(op, "phase2_backward") == 0;
        pr->p.op = backward ? ATTNRES_OP_PHASE2_BACKWARD : ATTNRES_OP_PHASE2;
        pr->p.n = 1;
        pr->p.fuse_add = fuse;
        snprintf(pr->label, sizeof pr->label, "%s %s%s", sh->name, op, fuse ? " fused add" : "");
        n++;
    }
    return n;
}

static double kib(double bytes) { return bytes / 1024.0; }

int main(int argc, char **argv)
{
    int64_t tokens[8] = {8, 1};
    int ntok = 2;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
            ntok = 0;
            for (char *s = argv[++i], *e; *s && ntok < 8; s = *e ? e + 1 : e) {
                tokens[ntok] = strtoll(s, &e, 10);
                if (e == s || tokens[ntok] < 1 || tokens[ntok] > MAX_T) {
                    fprintf(stderr, "--tokens: a comma-separated list of T in 1..%d\n", MAX_T);
                    return 2;
                }
                ntok++;
            }
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else {
            fprintf(stderr, "usage: cudasim_traffic [--tokens 8,1] [--only SUBSTRING]\n");
            return strcmp(argv[i], "--help") == 0 ? 0 : 2;
        }
    }
    char msg[1024];
    const char *driver = getenv("ATTNRES_CUDA_DRIVER");
    if (!driver || !*driver) {
        fprintf(stderr, "cudasim_traffic: ATTNRES_CUDA_DRIVER must name libattnres-cudasim.so\n");
        return 2;
    }
    if (ar_nvrtc_available(msg, sizeof msg) != 0) {
        fprintf(stderr, "cudasim_traffic: NVRTC is not available: %s\n", msg);
        return 1;
    }
    if (attnres_device_open("cuda:0", &dev, msg, sizeof msg) != ATTNRES_OK) {
        fprintf(stderr, "cudasim_traffic: cuda:0 did not open with ATTNRES_CUDA_DRIVER=%s: %s\n", driver, msg);
        return 1;
    }
    void *h = dlopen(driver, RTLD_NOW | RTLD_NOLOAD);
    if (h)
        *(void **)&take_traffic = dlsym(h, "cudasimTakeTraffic");
    if (!take_traffic) {
        fprintf(stderr, "cudasim_traffic: %s (as loaded by the backend) has no cudasimTakeTraffic\n", driver);
        return 1;
    }
    const char *tdir = getenv("ATTNRES_TEMPLATE_DIR");
    if (!tdir || !*tdir)
        tdir = ATTNRES_TEMPLATE_DIR;
    const char *arch = strncmp(dev->arch, "sm_", 3) == 0 ? dev->arch : "sm_90";
    int major = 0, minor = 0;
    ar_nvrtc_version(&major, &minor);
    printf("Device: %s (%s), NVRTC %d.%d, kernels compiled for %s and loaded as PTX.\n\n", dev->name, dev->driver,
           major, minor, arch);
    printf("| problem | variant | T | requests | sectors/req | ideal | bytes/req / 32 | read KiB | written KiB "
           "| minimal KiB (R + W) | distinct / minimal | apart KiB | distinct / (minimal + apart) | sectors KiB "
           "| sectors / minimal |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    char refused[8192] = "";
    size_t rused = 0;
    static const char *const templates[] = {"cuda/mix_online",   "cuda/mix_twopass",     "cuda/phase1",
                                            "cuda/phase2",       "cuda/mix_backward",    "cuda/phase1_backward",
                                            "cuda/phase2_backward"};
    for (size_t t = 0; t < sizeof templates / sizeof templates[0]; t++) {
        argen *g = NULL;
        if (argen_open(tdir, templates[t], &g, msg, sizeof msg) != 0) {
            fprintf(stderr, "template %s: %s\n", templates[t], msg);
            failures++;
            continue;
        }
        argen_variant *list = NULL;
        size_t count = 0;
        char *generic = NULL;
        if (argen_enumerate(g, &list, &count) != 0) {
            fprintf(stderr, "template %s: %s\n", templates[t], argen_errmsg(g));
            failures++;
            argen_close(g);
            continue;
        }
        problem probs[4];
        int np = 0;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            np += problems_of(argen_op(g), &shapes[s], probs + np);
        /* cuda/mix_online has no generic variant; the mix's is two-pass. */
        if (argen_generic(g, "bf16", &generic) != 0)
            generic = NULL;
        /* Problem-major order: each problem's variants side by side. */
        for (int pi = 0; pi < np; pi++) {
            const problem *pr = &probs[pi];
            for (size_t i = 0; i < count; i++) {
                const argen_variant *v = &list[i];
                const int is_generic = generic && strcmp(v->id, generic) == 0;
                if (!strstr(v->params_json, "\"dtype\":\"bf16\"") ||
                    (!is_generic && ar_json_int(v->params_json, "default", 0) != 1) || (only && !strstr(v->id, only)))
                    continue;
                argen_device ad = {.backend = "cuda", .arch = dev->arch, .units = dev->units};
                char why[256] = "";
                int ok = 1;
                for (int ti = 0; ti < ntok && ok == 1; ti++) {
                    argen_problem ap = {.op = argen_op(g), .dtype = "bf16", .form = "replace", .d = pr->p.d,
                                        .t = tokens[ti], .n = pr->p.n, .heads = pr->p.heads, .s = pr->p.s};
                    ok = argen_applies(g, v->id, &ap, &ad, why, sizeof why);
                }
                if (ok != 1) {
                    if (ok < 0) {
                        fprintf(stderr, "%s: applies(): %s\n", v->id, argen_errmsg(g));
                        failures++;
                    } else if (rused < sizeof refused) {
                        rused += (size_t)snprintf(refused + rused, sizeof refused - rused, "- %s, `%s`: %s\n",
                                                  pr->label, v->id, why);
                    }
                    continue;
                }
                char *source = NULL, *kernel = NULL, *json = NULL, *log = NULL, name[160], err[1024];
                void *blob = NULL;
                size_t size = 0;
                ar_kernel k;
                memset(&k, 0, sizeof k);
                fprintf(stderr, "%s: %s ...\n", pr->label, v->id);
                snprintf(name, sizeof name, "%s.cu", v->id);
                if (argen_emit(g, v->id, &source, &kernel, &json) != 0 ||
                    ar_nvrtc_compile(source, name, arch, 0, &blob, &size, &log, NULL, err, sizeof err) != ATTNRES_OK ||
                    dev->ops->load(dev, blob, size, NULL, kernel, json, &k) != ATTNRES_OK) {
                    fprintf(stderr, "  %s: emit, compile or load failed: %s %s %s\n", v->id, argen_errmsg(g), err,
                            attnres_device_errmsg(dev));
                    failures++;
                } else {
                    const int64_t align = ar_json_int(json, "align", 0);
                    for (int ti = 0; ti < ntok; ti++) {
                        minimal m;
                        cudasim_traffic tr;
                        if (run_one(&k, &pr->p, tokens[ti], &m) != 0 || take_traffic(&tr) != 0) {
                            fprintf(stderr, "  %s T=%lld failed\n", v->id, (long long)tokens[ti]);
                            failures++;
                            continue;
                        }
                        const double moved = (double)(tr.read_bytes + tr.write_bytes), min = m.read + m.write;
                        const double rq = tr.requests ? (double)tr.requests : 1.0;
                        printf("| %s | `%s`%s | %lld | %llu | %.2f | %lld | %.2f | %.1f | %.1f | %.1f + %.1f | %.3f "
                               "| %.1f | %.3f | %.1f | %.2f |\n",
                               pr->label, v->id, is_generic ? " (generic)" : "", (long long)tokens[ti], tr.requests,
                               (double)tr.sectors / rq, (long long)align, (double)tr.bytes_requested / rq / 32.0,
                               kib((double)tr.read_bytes), kib((double)tr.write_bytes), kib(m.read), kib(m.write),
                               moved / min, kib(m.query), moved / (min + m.query), kib(32.0 * (double)tr.sectors),
                               32.0 * (double)tr.sectors / min);
                        fflush(stdout);
                    }
                    dev->ops->unload(dev, &k);
                }
                free(source), free(kernel), free(json), free(log), free(blob);
            }
        }
        free(generic);
        argen_variants_free(list, count);
        argen_close(g);
    }
    if (refused[0])
        printf("\nDefault variants applies() refuses for a problem:\n\n%s", refused);
    attnres_device_close(dev);
    if (failures)
        fprintf(stderr, "cudasim_traffic: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
