/*
 * cuda_args_phase2_backward.c - the CUDA launch of Block AttnRes phase 2's
 * backward (templates/cuda/phase2_backward.lua): its by-value struct
 * filled and checked against the problem and the kernel, the dynamic
 * shared memory of its per-head tables, and its two grids.
 *
 * The arguments mean what they mean to the CPU's (cpu_backend.c,
 * cpu_launch_phase2_backward): a stride of 0 is a whole row (d, or H for
 * lse and dlse); dsublayer is read only with the fused add, out_gain,
 * dnormed and dout_gain only with the epilogue, whose loss may leave dout
 * NULL (a gradient of out of zero).
 */
#include <stdint.h>
#include <string.h>

#include "cuda_internal.h"

/* All of the kernel's shared memory, dynamic (its binary has none): per
 * head, without the epilogue, the sums of squares, q and pi, then p2 and
 * dx, 5 floats; with it the five sums of its pass A, then p2, dx and q, 8
 * floats; then 84 floats whatever H: 5 per-warp sums of up to 16 warps
 * (512 threads, the most a variant has) and the token's 4 scalars. So the
 * bound is on static and dynamic memory together, as a launch without an
 * opt-in has it. */
int64_t ar_cuda_phase2_backward_smem(const attnres_problem *p)
{
    return ((p->epilogue ? 8 : 5) * (int64_t)p->heads + 5 * 16 + 4) * (int64_t)sizeof(float);
}

/* The storage rows a launch reads or writes, each against the kernel's
 * alignment: NULL where the problem has no such row. */
typedef struct row_check {
    const void *ptr;
    int64_t stride;
    const char *name;
} row_check;

int ar_cuda_fill_phase2_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                 const attnres_phase2_backward_args *a, cuda_launch_data *l)
{
    const cuda_kernel *ck = k->module;
    attnres_cuda_phase2_backward_args *args = &l->args.phase2_backward;
    if (!ck || !k->entry || !ck->sum || !ck->epi)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded, or lacks its sum or epilogue entry");
    const int H = p->heads;
    if (H < 1 || p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    /* The kernel loads align bytes at a time, whole within a head. */
    const int64_t vec = es && align > es ? align / es : 1;
    if ((p->d / H) % vec)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED,
                              "kernel %s loads %lld elements at a time, which do not divide the head width %lld "
                              "(d = %lld, H = %d)",
                              k->kernel_name, (long long)vec, (long long)(p->d / H), (long long)p->d, H);
    const int64_t smem = ar_cuda_phase2_backward_smem(p);
    if (smem > AR_CUDA_PHASE_BACKWARD_MAX_SMEM)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED,
                              "phase2_backward with H = %d%s needs %lld bytes of shared memory, over the %d a CUDA "
                              "phase2_backward kernel may use",
                              H, p->epilogue ? " and the epilogue" : "", (long long)smem,
                              AR_CUDA_PHASE_BACKWARD_MAX_SMEM);
    if (!a || !a->dquery)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the arguments and dquery are required");
    const int epilogue = p->epilogue != 0;
    ar_backward_ws ws = {0};
    const int fits = ar_backward_workspace_fits(dev, p->d, T, epilogue, a->workspace, a->workspace_size, &ws);
    if (fits != ATTNRES_OK)
        return fits;
    memset(args, 0, sizeof *args);
    if (T > 0) {
        if (!a->o1 || !a->lse || !a->partial || !a->query || !a->do1 || !a->dlse || !a->dpartial)
            return ar_device_fail(dev, ATTNRES_EINVAL, "o1, lse, partial, query, do1, dlse and dpartial are required");
        /* With the epilogue the loss may read normed alone: dout NULL is
         * then a gradient of out of zero. */
        if (!epilogue && !a->dout)
            return ar_device_fail(dev, ATTNRES_EINVAL, "dout is required");
        if (epilogue && (!a->out_gain || !a->dnormed))
            return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue's backward needs out_gain and dnormed");
        TAKE_VIEW(args, a, o1, p->d);
        TAKE_VIEW(args, a, lse, H);
        TAKE_VIEW(args, a, partial, p->d);
        TAKE_VIEW(args, a, dout, p->d);
        TAKE_VIEW(args, a, do1, p->d);
        TAKE_VIEW(args, a, dlse, H);
        TAKE_VIEW(args, a, dpartial, p->d);
        /* The sublayer's gradient exists only where the forward fused the
         * add; the caller may not want it (NULL). */
        args->dsublayer = p->fuse_add ? a->dsublayer : NULL;
        args->dsublayer_stride = ROW_STRIDE(a, dsublayer, p->d);
        if (epilogue) {
            args->out_gain = a->out_gain;
            args->out_eps = a->out_eps;
            TAKE_VIEW(args, a, dnormed, p->d);
        }
        const row_check rows[] = {
            {args->o1, args->o1_stride, "o1"},
            {args->partial, args->partial_stride, "partial"},
            {args->dout, args->dout_stride, "dout"},
            {args->dnormed, args->dnormed_stride, "dnormed"},
            {args->do1, args->do1_stride, "do1"},
            {args->dpartial, args->dpartial_stride, "dpartial"},
            {args->dsublayer, args->dsublayer_stride, "dsublayer"},
        };
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            if (rows[i].ptr && ar_cuda_view_misaligned(rows[i].ptr, rows[i].stride, es, align))
                return ar_device_fail(dev, ATTNRES_EINVAL,
                                      "%s (pointer or stride %lld) is not %lld-byte aligned as kernel %s needs",
                                      rows[i].name, (long long)rows[i].stride, (long long)align, k->kernel_name);
        if (ar_cuda_misaligned(args->lse, 4) || ar_cuda_misaligned(args->dlse, 4))
            return ar_device_fail(dev, ATTNRES_EINVAL, "lse or dlse is not 4-byte aligned");
        const int aligned = ar_cuda_check_fp32_rows(dev, k, a->query, args->out_gain, a->workspace);
        if (aligned != ATTNRES_OK)
            return aligned;
        args->ws_du = a->workspace;
        args->ws_dgout = epilogue ? (float *)((char *)a->workspace + ws.dgout_offset) : NULL;
    }
    FILL_SHAPE(args, a, p, H, T);
    args->query = a->query;
    args->accumulate = (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0;
    args->group = AR_GRAD_GROUP;
    args->groups = (T + AR_GRAD_GROUP - 1) / AR_GRAD_GROUP;
    args->dquery = a->dquery;
    /* The gradient of out_gain, also at T = 0 (the sums write zeros). */
    args->dout_gain = epilogue ? a->dout_gain : NULL;
    if (ar_cuda_misaligned(args->dquery, 4) || (args->dout_gain && ar_cuda_misaligned(args->dout_gain, 4)))
        return ar_device_fail(dev, ATTNRES_EINVAL, "dquery or dout_gain is not 4-byte aligned");
    l->grid = args->groups;
    l->smem = smem + k->smem;
    l->sum_grid = (p->d + k->threads - 1) / k->threads;
    l->first = epilogue ? ck->epi : NULL;
    return ATTNRES_OK;
}
