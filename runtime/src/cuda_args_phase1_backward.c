/*
 * cuda_args_phase1_backward.c - the CUDA launch of Block AttnRes phase 1's
 * backward (templates/cuda/phase1_backward.lua): its per-token tables'
 * shared memory, and its by-value struct and two launches filled from the
 * caller's arguments after checking them against the problem and the
 * kernel, as cuda_args.c does for the mix backward.
 */
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"

/* The kernel's per-token tables in dynamic shared memory (the template's
 * header): s_q, s_p and s_a, n * S * H floats each, then s_r and s_c, n
 * floats each. */
int64_t ar_cuda_phase1_backward_smem(const attnres_problem *p)
{
    return (3 * (int64_t)p->n * p->s * p->heads + 2 * (int64_t)p->n) * (int64_t)sizeof(float);
}

/* Every site's do1 and dlse: do1 rows as the sources (storage type, align
 * bytes), dlse rows fp32 and read one float at a time. A NULL dlse array,
 * or a NULL entry, is a zero gradient of that site's lse. */
static int fill_site_views(attnres_device *dev, const ar_kernel *k, const attnres_problem *p,
                           const attnres_phase1_backward_args *a, int64_t es, int64_t align,
                           attnres_cuda_phase1_backward_args *args)
{
    args->do1_stride = ROW_STRIDE(a, do1, p->d);
    args->dlse_stride = ROW_STRIDE(a, dlse, p->heads);
    for (int j = 0; j < p->s; j++) {
        const float *dlse = a->dlse ? a->dlse[j] : NULL;
        if (!a->do1[j])
            return ar_device_fail(dev, ATTNRES_EINVAL, "do1 of site %d is NULL", j);
        if (ar_cuda_view_misaligned(a->do1[j], args->do1_stride, es, align) || ar_cuda_misaligned(dlse, 4))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "do1 of site %d (pointer or stride) is not %lld-byte aligned as kernel %s needs, "
                                  "or its dlse is not 4-byte aligned",
                                  j, (long long)align, k->kernel_name);
        args->do1[j] = a->do1[j];
        args->dlse[j] = dlse;
    }
    return ATTNRES_OK;
}

int ar_cuda_fill_phase1_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                 const attnres_phase1_backward_args *a, cuda_launch_data *l)
{
    const cuda_kernel *ck = k->module;
    attnres_cuda_phase1_backward_args *args = &l->args.phase1_backward;
    if (!ck || !k->entry || !ck->sum)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded, or lacks its sum entry");
    const int n = p->n, S = p->s, H = p->heads;
    if (n < 1 || n > AR_CUDA_PHASE1_MAX_SOURCES || S < 1 || S > AR_CUDA_PHASE1_MAX_SITES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED,
                              "CUDA phase1_backward kernels take 1 to %d sources and 1 to %d sites, not N = %d "
                              "and S = %d",
                              AR_CUDA_PHASE1_MAX_SOURCES, AR_CUDA_PHASE1_MAX_SITES, n, S);
    if (H < 1 || p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    const int64_t smem = ar_cuda_phase1_backward_smem(p);
    if (smem > AR_CUDA_PHASE_BACKWARD_MAX_SMEM)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED,
                              "phase1_backward with N = %d, S = %d, H = %d needs %lld bytes of shared memory, over "
                              "the %d a CUDA phase1_backward kernel may use",
                              n, S, H, (long long)smem, AR_CUDA_PHASE_BACKWARD_MAX_SMEM);
    if (!a || !a->dqueries)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the arguments and dqueries are required");
    /* A group's rows of du: d floats per site. */
    const int64_t row = p->d * S;
    ar_backward_ws ws = {0};
    const int fits = ar_backward_workspace_fits(dev, row, T, 0, a->workspace, a->workspace_size, &ws);
    if (fits != ATTNRES_OK)
        return fits;
    memset(args, 0, sizeof *args);
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    /* fp32 source gradients take VEC floats per access, as the queries do
     * (qalign), instead of VEC storage elements. */
    const int dsrc_f32 = (a->flags & ATTNRES_GRAD_DSOURCES_F32) != 0;
    const int64_t des = dsrc_f32 ? 4 : es, dalign = dsrc_f32 ? ck->qalign : align;
    if (T > 0) {
        if (!a->sources || !a->queries || !a->do1 || !a->dsources)
            return ar_device_fail(dev, ATTNRES_EINVAL, "sources, queries, do1 and dsources are required");
        const cuda_source_views views = {a->sources, a->source_strides, a->dsources, a->dsource_strides};
        int rc = ar_cuda_fill_source_gradients(dev, k, p, &views, es, align, des, dalign, args->src,
                                               args->src_stride, args->dsrc, args->dsrc_stride);
        if (rc != ATTNRES_OK || (rc = fill_site_views(dev, k, p, a, es, align, args)) != ATTNRES_OK)
            return rc;
        /* The workspace's rows take up to 16-byte accesses. */
        if (ar_cuda_misaligned(a->queries, ck->qalign) || ar_cuda_misaligned(a->workspace, 16))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "queries is not %d-byte aligned as kernel %s needs, or the workspace not 16-byte",
                                  ck->qalign, k->kernel_name);
        args->ws_du = a->workspace;
    }
    FILL_SHAPE(args, a, p, H, T);
    args->n = n;
    args->s = S;
    args->queries = a->queries;
    args->accumulate = (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0;
    args->dsrc_f32 = dsrc_f32;
    args->group = AR_GRAD_GROUP;
    args->groups = (T + AR_GRAD_GROUP - 1) / AR_GRAD_GROUP;
    /* Written also at T = 0: the sums over no tokens are zeros. */
    args->dqueries = a->dqueries;
    if (ar_cuda_misaligned(args->dqueries, 4))
        return ar_device_fail(dev, ATTNRES_EINVAL, "dqueries is not 4-byte aligned");
    l->grid = args->groups;
    l->smem = smem + k->smem;
    l->sum_grid = (row + k->threads - 1) / k->threads;
    l->first = NULL;
    return ATTNRES_OK;
}
