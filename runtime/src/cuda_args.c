/*
 * cuda_args.c - CUDA launches: the limits a problem is checked against, each
 * op's by-value argument struct filled and checked against the problem and
 * the kernel, and the launch itself.
 *
 * Kernels take one by-value argument (cuda_kernel_abi.h for mix,
 * cuda_phase_abi.h for the Block AttnRes phases), so a launch allocates
 * nothing and can be captured in a CUDA graph.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

/* The dynamic shared memory phase 1's softmax weights take per block. */
static int64_t phase1_weights_smem(const attnres_problem *p)
{
    return ((int64_t)p->n * p->s * p->heads + (int64_t)p->n * p->heads + p->n) * (int64_t)sizeof(float);
}

/* The dynamic shared memory of the mix backward's per-token tables
 * (templates/cuda/mix_backward.lua): three of n * H floats, two of n, one
 * of H; with the output-norm epilogue, first the token's fp32 gradient of
 * out, d floats. */
static int64_t mix_backward_tables_smem(const attnres_problem *p)
{
    return (3 * (int64_t)p->n * p->heads + 2 * (int64_t)p->n + p->heads + (p->epilogue ? p->d : 0)) *
           (int64_t)sizeof(float);
}

/* Refuses, with `status`, a phase 1 (its weights) or a mix backward (its
 * tables) that needs more shared memory than its CUDA kernel may use:
 * EINVAL when a plan is made, and EUNSUPPORTED when a launch outside a
 * plan (the tuner's) gets that far. */
static int tables_smem_check(attnres_device *dev, const attnres_problem *p, int status)
{
    const int phase1 = p->op == ATTNRES_OP_PHASE1;
    const int64_t smem = phase1 ? phase1_weights_smem(p) : mix_backward_tables_smem(p);
    const int max = phase1 ? AR_CUDA_PHASE1_MAX_SMEM : AR_CUDA_MIX_BACKWARD_MAX_SMEM;
    if (smem <= max)
        return ATTNRES_OK;
    const char *op = phase1 ? "phase1" : "mix_backward";
    char shape[96];
    if (phase1)
        snprintf(shape, sizeof shape, "N = %d, S = %d, H = %d", p->n, p->s, p->heads);
    else if (p->epilogue)
        snprintf(shape, sizeof shape, "N = %d, H = %d, d = %lld and the epilogue", p->n, p->heads,
                 (long long)p->d);
    else
        snprintf(shape, sizeof shape, "N = %d, H = %d", p->n, p->heads);
    return ar_device_fail(dev, status,
                          "%s with %s needs %lld bytes of shared memory, over the %d a CUDA %s kernel may use", op,
                          shape, (long long)smem, max, op);
}

/* What no CUDA kernel runs, refused when the plan is made: the launch
 * checks below stay for launches outside a plan (the tuner's). */
int ar_cuda_check_problem(attnres_device *dev, const attnres_problem *p)
{
    const int n = p->n, S = p->s, H = p->heads;
    if (p->op == ATTNRES_OP_PHASE1_BACKWARD || p->op == ATTNRES_OP_PHASE2_BACKWARD) {
        const int phase1 = p->op == ATTNRES_OP_PHASE1_BACKWARD;
        if (phase1 && (n > AR_CUDA_PHASE1_MAX_SOURCES || S > AR_CUDA_PHASE1_MAX_SITES))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "the CUDA phase1_backward kernels take at most %d sources and %d sites (N = %d, "
                                  "S = %d)",
                                  AR_CUDA_PHASE1_MAX_SOURCES, AR_CUDA_PHASE1_MAX_SITES, n, S);
        const int64_t smem = phase1 ? ar_cuda_phase1_backward_smem(p) : ar_cuda_phase2_backward_smem(p);
        if (smem > AR_CUDA_PHASE_BACKWARD_MAX_SMEM)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "%s with N = %d, S = %d, H = %d, d = %lld%s needs %lld bytes of shared memory, over "
                                  "the %d a CUDA %s kernel may use",
                                  ar_op_name(p->op), n, S, H, (long long)p->d, p->epilogue ? " and the epilogue" : "",
                                  (long long)smem, AR_CUDA_PHASE_BACKWARD_MAX_SMEM, ar_op_name(p->op));
        return ATTNRES_OK;
    }
    if (p->op == ATTNRES_OP_MIX_BACKWARD) {
        if (n > AR_CUDA_MAX_SOURCES)
            return ar_device_fail(dev, ATTNRES_EINVAL, "the CUDA mix_backward kernels take at most %d sources (N = %d)",
                                  AR_CUDA_MAX_SOURCES, n);
        return tables_smem_check(dev, p, ATTNRES_EINVAL);
    }
    if (p->op == ATTNRES_OP_MIX && n > AR_CUDA_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the CUDA kernels take at most %d sources (N = %d)",
                              AR_CUDA_MAX_SOURCES, n);
    if (p->op == ATTNRES_OP_PHASE1) {
        if (n > AR_CUDA_PHASE1_MAX_SOURCES || S > AR_CUDA_PHASE1_MAX_SITES)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "the CUDA phase1 kernels take at most %d sources and %d sites (N = %d, S = %d)",
                                  AR_CUDA_PHASE1_MAX_SOURCES, AR_CUDA_PHASE1_MAX_SITES, n, S);
        const int rc = tables_smem_check(dev, p, ATTNRES_EINVAL);
        if (rc != ATTNRES_OK)
            return rc;
    }
    if (p->op == ATTNRES_OP_PHASE2 && H > AR_CUDA_PHASE2_MAX_HEADS)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the CUDA phase2 kernels take at most %d heads (H = %d)",
                              AR_CUDA_PHASE2_MAX_HEADS, H);
    return ATTNRES_OK;
}

/* ---- launch ------------------------------------------------------------ */

/* The n sources of a mix or a phase 1 into a by-value struct's arrays
 * (src, src_stride): a stride of 0 (or no strides) means d; a NULL or
 * misaligned source is refused with a message. */
static int fill_sources(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, const void *const *sources,
                        const int64_t *strides, int64_t align, const void **src, int64_t *src_stride)
{
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype);
    for (int i = 0; i < p->n; i++) {
        const int64_t stride = strides && strides[i] ? strides[i] : p->d;
        if (!sources[i])
            return ar_device_fail(dev, ATTNRES_EINVAL, "source %d is NULL", i);
        if (ar_cuda_view_misaligned(sources[i], stride, es, align))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "source %d (pointer or stride %lld) is not %lld-byte aligned as kernel %s needs", i,
                                  (long long)stride, (long long)align, k->kernel_name);
        src[i] = sources[i];
        src_stride[i] = stride;
    }
    return ATTNRES_OK;
}

/* The outputs that a mix and a phase 2 share, from the caller's arguments
 * `a` into the by-value struct `args` (the fields have the same names in
 * both): a stride of 0 means d, and the epilogue's pointers are kept only
 * when the problem has one. */
#define FILL_OUTPUTS(args, a, p)                                                  \
    do {                                                                          \
        TAKE_VIEW(args, a, out, (p)->d);                                          \
        (args)->out_gain = (p)->epilogue ? (a)->out_gain : NULL;                  \
        (args)->out_eps = (a)->out_eps;                                           \
        (args)->normed = (p)->epilogue ? (a)->normed : NULL;                      \
        (args)->normed_stride = ROW_STRIDE(a, normed, (p)->d);                    \
    } while (0)

/* Fills the by-value argument struct; EINVAL/EMISMATCH with a message when
 * the arguments cannot be run by this kernel. No allocation. */
static int fill_mix(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                     const attnres_mix_args *a, attnres_cuda_mix_args *args)
{
    const cuda_kernel *ck = k->module;
    const int n = p->n;
    if (n < 1 || n > AR_CUDA_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA kernels take 1 to %d sources, not %d",
                              AR_CUDA_MAX_SOURCES, n);
    if (!ck || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    if (ck->dmax && p->d > ck->dmax)
        return ar_device_fail(dev, ATTNRES_EMISMATCH, "d = %lld exceeds the %lld that kernel %s handles",
                              (long long)p->d, (long long)ck->dmax, k->kernel_name);
    if (!a || !a->sources || !a->query || !a->out)
        return ar_device_fail(dev, ATTNRES_EINVAL, "sources, query and out are required");
    if (p->form == ATTNRES_FORM_ADDITIVE && !a->partial)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the additive form needs partial");
    if (p->epilogue && (!a->normed || !a->out_gain))
        return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue needs normed and out_gain");
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype);
    const int64_t align = ck->align;
    const int rc = fill_sources(dev, k, p, a->sources, a->source_strides, align, args->src, args->src_stride);
    if (rc != ATTNRES_OK)
        return rc;
    if (n < AR_CUDA_MAX_SOURCES) {
        memset(&args->src[n], 0, (size_t)(AR_CUDA_MAX_SOURCES - n) * sizeof args->src[0]);
        memset(&args->src_stride[n], 0, (size_t)(AR_CUDA_MAX_SOURCES - n) * sizeof args->src_stride[0]);
    }
    FILL_SHAPE(args, a, p, p->heads, T);
    args->n = n;
    args->query = a->query;
    args->partial = p->form == ATTNRES_FORM_ADDITIVE ? a->partial : NULL;
    args->partial_stride = ROW_STRIDE(a, partial, p->d);
    args->alpha = a->alpha;
    FILL_OUTPUTS(args, a, p);
    if (ar_cuda_view_misaligned(args->out, args->out_stride, es, align) ||
        (args->partial && ar_cuda_view_misaligned(args->partial, args->partial_stride, es, align)) ||
        (args->normed && ar_cuda_view_misaligned(args->normed, args->normed_stride, es, align)))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "out, partial or normed (pointer or stride) is not %lld-byte aligned as kernel %s needs",
                              (long long)align, k->kernel_name);
    if (ar_cuda_misaligned(args->query, ck->qalign) ||
        (args->out_gain && ar_cuda_misaligned(args->out_gain, ck->qalign)))
        return ar_device_fail(dev, ATTNRES_EINVAL, "query or out_gain is not %d-byte aligned as kernel %s needs",
                              ck->qalign, k->kernel_name);
    return ATTNRES_OK;
}

/* ---- Block AttnRes phases ---------------------------------------------- */

/* Fills phase 1's by-value struct and the dynamic shared memory it needs;
 * EINVAL/EUNSUPPORTED with a message when this kernel cannot run them. */
static int fill_phase1(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                       const attnres_phase1_args *a, attnres_cuda_phase1_args *args, int64_t *smem_out)
{
    const cuda_kernel *ck = k->module;
    if (!ck || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    const int n = p->n, S = p->s, H = p->heads;
    if (n < 1 || n > AR_CUDA_PHASE1_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA phase1 kernels take 1 to %d sources, not %d",
                              AR_CUDA_PHASE1_MAX_SOURCES, n);
    if (S < 1 || S > AR_CUDA_PHASE1_MAX_SITES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA phase1 kernels take 1 to %d sites, not %d",
                              AR_CUDA_PHASE1_MAX_SITES, S);
    if (H < 1 || p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    const int smem_rc = tables_smem_check(dev, p, ATTNRES_EUNSUPPORTED);
    if (smem_rc != ATTNRES_OK)
        return smem_rc;
    const int64_t smem = phase1_weights_smem(p);
    if (!a || !a->sources || !a->queries || !a->o1 || !a->lse)
        return ar_device_fail(dev, ATTNRES_EINVAL, "sources, queries, o1 and lse are required");
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    memset(args, 0, sizeof *args);
    const int rc = fill_sources(dev, k, p, a->sources, a->source_strides, align, args->src, args->src_stride);
    if (rc != ATTNRES_OK)
        return rc;
    args->o1_stride = ROW_STRIDE(a, o1, p->d);
    args->lse_stride = ROW_STRIDE(a, lse, H);
    for (int j = 0; j < S; j++) {
        if (!a->o1[j] || !a->lse[j])
            return ar_device_fail(dev, ATTNRES_EINVAL, "o1 or lse of site %d is NULL", j);
        if (ar_cuda_view_misaligned(a->o1[j], args->o1_stride, es, align) || ar_cuda_misaligned(a->lse[j], 4))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "o1 of site %d (pointer or stride) is not %lld-byte aligned as kernel %s needs, "
                                  "or its lse is not 4-byte aligned",
                                  j, (long long)align, k->kernel_name);
        args->o1[j] = a->o1[j];
        args->lse[j] = a->lse[j];
    }
    if (ar_cuda_misaligned(a->queries, ck->qalign))
        return ar_device_fail(dev, ATTNRES_EINVAL, "queries is not %d-byte aligned as kernel %s needs", ck->qalign,
                              k->kernel_name);
    FILL_SHAPE(args, a, p, H, T);
    args->n = n;
    args->s = S;
    args->queries = a->queries;
    *smem_out = smem + k->smem;
    return ATTNRES_OK;
}

/* Fills phase 2's by-value struct; EINVAL/EUNSUPPORTED with a message when
 * this kernel cannot run the arguments. */
static int fill_phase2(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                       const attnres_phase2_args *a, attnres_cuda_phase2_args *args)
{
    const cuda_kernel *ck = k->module;
    if (!ck || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    const int H = p->heads;
    if (H < 1 || H > AR_CUDA_PHASE2_MAX_HEADS)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA phase2 kernels take 1 to %d heads, not %d",
                              AR_CUDA_PHASE2_MAX_HEADS, H);
    if (p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    if (!a || !a->o1 || !a->lse || !a->partial || !a->query || !a->out)
        return ar_device_fail(dev, ATTNRES_EINVAL, "o1, lse, partial, query and out are required");
    if (p->fuse_add && !a->sublayer)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the fused add needs sublayer");
    if (p->epilogue && (!a->normed || !a->out_gain))
        return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue needs normed and out_gain");
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    memset(args, 0, sizeof *args);
    FILL_SHAPE(args, a, p, H, T);
    TAKE_VIEW(args, a, o1, p->d);
    TAKE_VIEW(args, a, lse, H);
    TAKE_VIEW(args, a, partial, p->d);
    args->sublayer = p->fuse_add ? a->sublayer : NULL;
    args->sublayer_stride = ROW_STRIDE(a, sublayer, p->d);
    args->query = a->query;
    FILL_OUTPUTS(args, a, p);
    if (ar_cuda_view_misaligned(args->o1, args->o1_stride, es, align) ||
        ar_cuda_view_misaligned(args->partial, args->partial_stride, es, align) ||
        ar_cuda_view_misaligned(args->out, args->out_stride, es, align) ||
        (args->sublayer && ar_cuda_view_misaligned(args->sublayer, args->sublayer_stride, es, align)) ||
        (args->normed && ar_cuda_view_misaligned(args->normed, args->normed_stride, es, align)))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "o1, partial, sublayer, out or normed (pointer or stride) is not %lld-byte aligned as "
                              "kernel %s needs",
                              (long long)align, k->kernel_name);
    if (ar_cuda_misaligned(args->lse, 4) || ar_cuda_misaligned(args->query, ck->qalign) ||
        (args->out_gain && ar_cuda_misaligned(args->out_gain, ck->qalign)))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "lse is not 4-byte aligned, or query or out_gain is not %d-byte aligned as kernel %s "
                              "needs",
                              ck->qalign, k->kernel_name);
    return ATTNRES_OK;
}

/* ---- the backwards' sources and their gradients ---------------------- */

int ar_cuda_fill_source_gradients(attnres_device *dev, const ar_kernel *k, const attnres_problem *p,
                                  const cuda_source_views *v, int64_t es, int64_t align, int64_t des,
                                  int64_t dalign, const void **src, int64_t *src_stride, void **dsrc,
                                  int64_t *dsrc_stride)
{
    for (int i = 0; i < p->n; i++) {
        const int64_t stride = v->strides && v->strides[i] ? v->strides[i] : p->d;
        const int64_t dstride = v->dstrides && v->dstrides[i] ? v->dstrides[i] : p->d;
        if (!v->sources[i] || !v->dsources[i])
            return ar_device_fail(dev, ATTNRES_EINVAL, "source %d or its gradient is NULL", i);
        if (ar_cuda_view_misaligned(v->sources[i], stride, es, align) ||
            ar_cuda_view_misaligned(v->dsources[i], dstride, des, dalign))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "source %d or its gradient (pointer or stride) is not %lld-byte (%lld-byte) "
                                  "aligned as kernel %s needs",
                                  i, (long long)align, (long long)dalign, k->kernel_name);
        src[i] = v->sources[i];
        src_stride[i] = stride;
        dsrc[i] = v->dsources[i];
        dsrc_stride[i] = dstride;
    }
    return ATTNRES_OK;
}

/* ---- the mix backward -------------------------------------------------- */

/* Fills the mix backward's by-value struct (both entries take it), its
 * dynamic shared memory and the two grids: one block per token group, then
 * one thread per element of dquery. T may be 0: then only the sums run,
 * and write zeros (to dout_gain too with the epilogue). */
int ar_cuda_check_fp32_rows(attnres_device *dev, const ar_kernel *k, const void *query, const void *out_gain,
                            const void *workspace)
{
    const cuda_kernel *ck = k->module;
    if (ar_cuda_misaligned(query, ck->qalign) || (out_gain && ar_cuda_misaligned(out_gain, ck->qalign)) ||
        ar_cuda_misaligned(workspace, 16))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "query or out_gain is not %d-byte aligned as kernel %s needs, or the workspace not "
                              "16-byte",
                              ck->qalign, k->kernel_name);
    return ATTNRES_OK;
}

static int fill_mix_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                             const attnres_mix_backward_args *a, cuda_launch_data *l)
{
    const cuda_kernel *ck = k->module;
    attnres_cuda_mix_backward_args *args = &l->args.mix_backward;
    if (!ck || !k->entry || !ck->sum || !ck->epi)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded, or lacks its sum or epilogue entry");
    const int n = p->n, H = p->heads;
    if (n < 1 || n > AR_CUDA_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA mix_backward kernels take 1 to %d sources, not %d",
                              AR_CUDA_MAX_SOURCES, n);
    if (H < 1 || p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    const int smem_rc = tables_smem_check(dev, p, ATTNRES_EUNSUPPORTED);
    if (smem_rc != ATTNRES_OK)
        return smem_rc;
    const int64_t smem = mix_backward_tables_smem(p);
    if (!a || !a->dquery)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the arguments and dquery are required");
    const int additive = p->form == ATTNRES_FORM_ADDITIVE, epilogue = p->epilogue != 0;
    ar_backward_ws ws = {0};
    const int fits = ar_backward_workspace_fits(dev, p->d, T, epilogue, a->workspace, a->workspace_size, &ws);
    if (fits != ATTNRES_OK)
        return fits;
    memset(args, 0, sizeof *args);
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    /* fp32 source gradients take VEC floats per access, as the query does
     * (qalign), instead of VEC storage elements. */
    const int dsrc_f32 = (a->flags & ATTNRES_GRAD_DSOURCES_F32) != 0;
    const int64_t des = dsrc_f32 ? 4 : es, dalign = dsrc_f32 ? ck->qalign : align;
    if (T > 0) {
        if (!a->sources || !a->query || !a->dsources || (additive && !a->dpartial))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "sources, query, dsources (and dpartial in the additive form) are required");
        /* With the epilogue the loss may read normed alone: dout NULL is
         * then a gradient of out of zero. */
        if (!epilogue && !a->dout)
            return ar_device_fail(dev, ATTNRES_EINVAL, "dout is required");
        if (epilogue && (!a->out || !a->out_gain || !a->dnormed))
            return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue's backward needs out, out_gain and dnormed");
        const cuda_source_views views = {a->sources, a->source_strides, a->dsources, a->dsource_strides};
        const int rc = ar_cuda_fill_source_gradients(dev, k, p, &views, es, align, des, dalign, args->src,
                                                     args->src_stride, args->dsrc, args->dsrc_stride);
        if (rc != ATTNRES_OK)
            return rc;
        TAKE_VIEW(args, a, dout, p->d);
        args->dpartial = additive ? a->dpartial : NULL;
        args->dpartial_stride = ROW_STRIDE(a, dpartial, p->d);
        if (epilogue) {
            TAKE_VIEW(args, a, out, p->d);
            args->out_gain = a->out_gain;
            args->out_eps = a->out_eps;
            TAKE_VIEW(args, a, dnormed, p->d);
        }
        if ((args->dout && ar_cuda_view_misaligned(args->dout, args->dout_stride, es, align)) ||
            (args->dpartial && ar_cuda_view_misaligned(args->dpartial, args->dpartial_stride, es, align)) ||
            (args->out && ar_cuda_view_misaligned(args->out, args->out_stride, es, align)) ||
            (args->dnormed && ar_cuda_view_misaligned(args->dnormed, args->dnormed_stride, es, align)))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "dout, dpartial, out or dnormed (pointer or stride) is not %lld-byte aligned as "
                                  "kernel %s needs",
                                  (long long)align, k->kernel_name);
        const int aligned = ar_cuda_check_fp32_rows(dev, k, a->query, args->out_gain, a->workspace);
        if (aligned != ATTNRES_OK)
            return aligned;
        args->ws_du = a->workspace;
        args->ws_dalpha = additive ? (float *)((char *)a->workspace + ws.alpha_offset) : NULL;
        args->ws_dgout = epilogue ? (float *)((char *)a->workspace + ws.dgout_offset) : NULL;
    }
    FILL_SHAPE(args, a, p, H, T);
    args->n = n;
    args->query = a->query;
    args->alpha = additive ? a->alpha : 1.0f;
    args->accumulate = (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0;
    args->dsrc_f32 = dsrc_f32;
    args->group = AR_GRAD_GROUP;
    args->groups = (T + AR_GRAD_GROUP - 1) / AR_GRAD_GROUP;
    args->dquery = a->dquery;
    args->dalpha = additive ? a->dalpha : NULL;
    /* The gradient of out_gain, also at T = 0 (the sums write zeros). */
    args->dout_gain = epilogue ? a->dout_gain : NULL;
    if (ar_cuda_misaligned(args->dquery, 4) || (args->dalpha && ar_cuda_misaligned(args->dalpha, 4)) ||
        (args->dout_gain && ar_cuda_misaligned(args->dout_gain, 4)))
        return ar_device_fail(dev, ATTNRES_EINVAL, "dquery, dalpha or dout_gain is not 4-byte aligned");
    l->grid = args->groups;
    l->smem = smem + k->smem;
    l->sum_grid = (p->d + k->threads - 1) / k->threads;
    l->first = epilogue ? ck->epi : NULL;
    return ATTNRES_OK;
}

/* ---- the op-generic launch --------------------------------------------- */

/* Checks the tagged arguments against the problem and the kernel and fills
 * l; T must be positive, or 0 for a backward. Mix kernels handle tokens_per_block tokens per
 * block, the phase kernels one token per block (cuda_phase_abi.h). */
int ar_cuda_prepare(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                    const ar_op_args *a, cuda_launch_data *l)
{
    if (!a || a->op != p->op)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the arguments are for op %d, the problem is op %d",
                              a ? (int)a->op : -1, (int)p->op);
    if (!k->module || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    int rc;
    l->sum_grid = 0;
    l->first = NULL;
    switch (a->op) {
    case ATTNRES_OP_MIX:
        rc = fill_mix(dev, k, p, T, a->mix, &l->args.mix);
        l->grid = (T + k->tokens_per_block - 1) / k->tokens_per_block;
        l->smem = k->smem;
        break;
    case ATTNRES_OP_PHASE1:
        rc = fill_phase1(dev, k, p, T, a->phase1, &l->args.phase1, &l->smem);
        l->grid = T;
        break;
    case ATTNRES_OP_PHASE2:
        rc = fill_phase2(dev, k, p, T, a->phase2, &l->args.phase2);
        l->grid = T;
        l->smem = k->smem;
        break;
    case ATTNRES_OP_MIX_BACKWARD:
        rc = fill_mix_backward(dev, k, p, T, a->mix_backward, l);
        break;
    case ATTNRES_OP_PHASE1_BACKWARD:
        rc = ar_cuda_fill_phase1_backward(dev, k, p, T, a->phase1_backward, l);
        break;
    case ATTNRES_OP_PHASE2_BACKWARD:
        rc = ar_cuda_fill_phase2_backward(dev, k, p, T, a->phase2_backward, l);
        break;
    default:
        return ar_device_fail(dev, ATTNRES_EINVAL, "unknown op %d", (int)a->op);
    }
    if (rc == ATTNRES_OK && l->grid > 0x7fffffff)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld needs more than 2^31-1 blocks", (long long)T);
    return rc;
}

/* Launches prepared work on `stream` with the context already current. */
int ar_cuda_launch_current(attnres_device *dev, const ar_kernel *k, cuda_launch_data *l, CUstream stream)
{
    void *params[] = {&l->args};
    CUresult r = CU_OK;
    if (l->grid > 0)
        r = ar_cuda_driver.LaunchKernel(l->first ? l->first : (CUfunction)k->entry, (unsigned)l->grid, 1, 1, (unsigned)k->threads, 1, 1,
                                        (unsigned)l->smem, stream, params, NULL);
    /* A backward's fixed-order sums, on the same stream: they start once
     * every group's partials are written. */
    if (r == CU_OK && l->sum_grid > 0)
        r = ar_cuda_driver.LaunchKernel(((const cuda_kernel *)k->module)->sum, (unsigned)l->sum_grid, 1, 1,
                                        (unsigned)k->threads, 1, 1, 0, stream, params, NULL);
    if (r != CU_OK) {
        char what[256];
        snprintf(what, sizeof what, "launching %s", k->kernel_name);
        return ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, what);
    }
    return ATTNRES_OK;
}

int ar_cuda_launch(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                   const ar_op_args *a, void *stream)
{
    /* T = 0 runs nothing, except a backward's sums over no tokens. */
    if (T == 0 && (!a || ar_op_forward(a->op) == a->op))
        return ATTNRES_OK;
    if (T < 0)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld is negative", (long long)T);
    cuda_launch_data l;
    int rc = ar_cuda_prepare(dev, k, p, T, a, &l);
    if (rc != ATTNRES_OK)
        return rc;
    int pushed;
    CUresult r = ar_cuda_ctx_enter(dev->state, &pushed);
    if (r != CU_OK)
        return ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "making the CUDA context current");
    rc = ar_cuda_launch_current(dev, k, &l, (CUstream)stream);
    ar_cuda_ctx_leave(pushed);
    return rc;
}
