-- cuda/phase2_backward.lua: the backward of Block AttnRes phase 2 (DESIGN
-- §1b) as CUDA C++ for NVRTC, one site, any H whose tables fit, with or
-- without the fused add and the output-norm epilogue. Same math as
-- cpu/phase2_backward.lua, and the same workspace layout (runtime/src/
-- device.h, ar_mix_backward_workspace: the groups' rows of du, then with
-- the epilogue the groups' rows of d(out_gain)).
--
-- The forward (cuda/phase2.lua) merged o1 with the partial sum b: per head
-- h, with r = rsqrt(mean(b^2) + eps) and q_h = sum_{k in h} b[k] u[k],
--   p2_h = sigmoid(scale r q_h - lse_h),   out = o1 + p2_h (b - o1).
--
-- Three entries in one module, all taking the same by-value struct
-- (lib/kernel_abi.lua, cuda_phase2_backward):
--   attnres_<id>      one block per token group (a.group tokens, fixed by
--                     the runtime for every kernel), the group's tokens in
--                     order. Per token, G the gradient of out (dout's row):
--                       sweep 1, b, o1 and dout from memory: per head the
--                         sum of squares of b, q and pi = sum G (b - o1);
--                       warp 0: r, per head p2 (recomputed: the forward
--                         saves only lse), dx = p2 (1 - p2) pi, written
--                         negated as d(lse), and c = sum_h dx q;
--                       sweep 2, b and dout again (in cache):
--                         d(o1) = G (1 - p2) and
--                         db = G p2 + scale r (dx u - b r^2 c / d),
--                         written or added (db also into dsublayer when
--                         the forward fused the add), and the token's
--                         share of du, scale r dx b, added into the
--                         group's fp32 row of the workspace.
--   attnres_<id>_epi  the same with the output-norm epilogue, the entry
--                     the runtime launches for a problem with one. Nothing
--                     keeps out, so the token recomputes it in fp32 as the
--                     forward did, y = o1 + p2 (b - o1), and G is
--                       G = dout + rs dnormed gain - y rs^3 <dnormed gain, y> / d
--                     (rs = rsqrt(mean(y^2) + out_eps); dout NULL: zero).
--                     Sweep 1 then gathers only b's sums of squares and q;
--                     warp 0 makes r and p2; pass A, over o1, b, dnormed,
--                     gain and dout, gathers per head sum y^2,
--                     <dnormed gain, y>, and the three parts of pi,
--                     <dout, b - o1>, <dnormed gain, b - o1> and
--                     <y, b - o1> (pi = the first + rs the second - rs^3
--                     <dnormed gain, y> / d the third, which is
--                     sum G (b - o1) without G's row); warp 0 makes rs,
--                     pi, dx and c; sweep 2 recomputes y and G per element
--                     (their rows are in cache) and also adds the token's
--                     share of d(out_gain), rs dnormed y, into the group's
--                     row. G is never stored, so d is not bounded by
--                     shared memory.
--   attnres_<id>_sum  the second pass: each element of dquery (and of
--                     d(out_gain) with the epilogue) is the sum of the
--                     groups' rows in group order; with no groups (T = 0)
--                     zero.
--
-- The passes with per-head sums split the row by heads as cuda/phase2.lua
-- does (several warps per head when the heads are fewer than the warps,
-- else one warp per head, heads in turns); sweep 2 gives each thread the
-- elements tid, tid + THREADS, ... (in vectors of VEC), the same for every
-- token of the block.
--
-- Determinism without atomics: a workspace element is only ever touched by
-- the one thread that owns it in sweep 2, the tokens of a group run in
-- order, the per-head and per-row sums are added in a fixed order (warp
-- shuffles, then warp order, then lanes over heads), and the sum entry
-- adds the groups in order. So every gradient is the same on every run;
-- the PTX has no atom. or red. instruction.
--
-- With accumulate every store of d(o1), db and dsublayer reads the element
-- back (a coherent load) just before it adds to it, on the thread that
-- stores it, so one buffer passed for several of them still sums each.
--
-- Shared memory per block, all of it dynamic, from the runtime
-- (runtime/src/cuda_args_phase2_backward.c, ar_cuda_phase2_backward_smem,
-- checked against AR_CUDA_PHASE_BACKWARD_MAX_SMEM = 48 KiB at plan time,
-- the most a kernel has without opting in: static and dynamic together):
--   per head, without the epilogue 5 floats (the sums of squares, q and
--     pi, then p2 and dx), with it 8 (the five sums of pass A, which sweep
--     1's two share, then p2, dx and q);
--   then 84 floats for any variant: 5 per-warp sums of up to 16 warps
--     (512 threads, the most a variant has; used where several warps share
--     a head) and the token's 4 scalars;
-- that is 4 (5 H + 84) or 4 (8 H + 84) bytes, so H <= 2440 or 1525.
--
-- Parameters and why they matter:
--   threads  threads per block: more loads in flight for one token (a
--            block runs its group's tokens one after another), at the
--            cost of idle threads when d is small.
--   vec      elements per load: 1 (any alignment, any head width) or a
--            16-byte load.
-- generic: 256 threads, scalar loads (any d, any H that fits).
--
-- Numerics: fp32 after loading; rsqrtf for 1/rms and for rs, the
-- logistic function as a ratio of one expf that never overflows; 64-bit
-- token offsets, 32-bit element indices (d <= 2^30).

local template = require("lib/template")
local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")
local kabi = require("lib/kernel_abi")

local esize = storage.esize
-- runtime/src/cuda_phase_abi.h, AR_CUDA_PHASE_BACKWARD_MAX_SMEM.
local MAX_SMEM = 48 * 1024
-- The tables' part that does not grow with H: NSUM per-warp sums of up to
-- MAX_WARPS warps, and 4 scalars.
local NSUM, MAX_WARPS = 5, 16
local SLOTS = NSUM * MAX_WARPS + 4

local T = template.new("cuda", "phase2_backward", {
  { name = "threads", values = { 128, 256, 512 } },
  { name = "vec", values = { 1, 4, 8 } },
}, {
  -- The runtime's built-in fallback: scalar loads (any alignment, any head
  -- width), any d, any H whose tables fit.
  generic = { threads = 256, vec = 1 },
})

T.constraint = space.scalar_or_16_bytes

function T.id(p)
  return string.format("phase2_backward_cu_%s_b%d_v%d", p.dtype, p.threads, p.vec)
end

-- The dynamic shared memory of a problem's tables, in bytes: the formula
-- of ar_cuda_phase2_backward_smem.
local function tables_smem(problem)
  return 4 * ((problem.epilogue and 8 or 5) * problem.heads + SLOTS)
end

function T.launch(p)
  -- One block per token group (the runtime sizes the grid by groups);
  -- the tables' dynamic shared memory comes from the runtime.
  return space.phase_launch(p, "cuda_phase2_backward", {
    default = (p.threads == 256 and p.vec * esize[p.dtype] == 16) and 1 or 0,
  })
end

function T.applies(p, problem, device)
  local ok, why = space.applies(T, p, problem, device, {})
  if not ok then return ok, why end
  local smem = tables_smem(problem)
  if smem > MAX_SMEM then
    return false, string.format("H = %d needs %d bytes of shared memory, over %d", problem.heads, smem, MAX_SMEM)
  end
  return true
end

-- ---- emitted code -------------------------------------------------------

local KERNEL = [[
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int NSUM = ${NSUM}; /* the most per-head sums one pass gathers (pass A) */
/* The per-warp sums have room for MAX_WARPS warps in every variant's
 * shared memory (the runtime's formula does not know THREADS). */
constexpr int MAX_WARPS = ${MAX_WARPS};
static_assert(WARPS <= MAX_WARPS, "more warps than the shared memory's per-warp sums hold");

/* The logistic function as the ratio of one exponential of a value <= 0,
 * which never overflows; NaN stays NaN. */
__device__ __forceinline__ float sigmoid(float x)
{
    const float e = expf(-fabsf(x));
    const float s = __fdividef(1.0f, 1.0f + e);
    return x >= 0.0f ? s : e * s;
}

/* How the passes with per-head sums split a row, as cuda/phase2.lua does:
 * wph warps per head when the heads are fewer than the warps (each warp
 * then has at most one head, h0), else one warp per head, the G groups of
 * warps taking the heads in turns. A lane keeps the same elements (v0,
 * v0 + vstep, ... vectors into the head) in every such pass. */
struct head_split {
    int wph, G, h0, sub, vstep, v0;
};

__device__ __forceinline__ head_split split_heads(int heads, int warp, int lane)
{
    head_split m;
    m.wph = heads < WARPS ? WARPS / heads : 1;
    m.G = WARPS / m.wph;
    const int g = warp / m.wph;
    m.sub = warp - g * m.wph;
    m.h0 = g < m.G ? g : heads; /* a leftover warp has no head */
    m.vstep = m.wph * 32;
    m.v0 = m.sub * 32 + lane;
    return m;
}

/* Lane 0's sum v of quantity q over its warp's part of head h: with several
 * warps per head, into the warp's slot of s_red (head_sum adds the slots
 * in warp order); with one, the whole head's, into s_sum directly. */
__device__ __forceinline__ void put_sum(float *s_sum, float *s_red, int q, int heads, int h, const head_split &m,
                                        float v)
{
    if (m.wph > 1)
        s_red[q * WARPS + h * m.wph + m.sub] = v;
    else
        s_sum[q * heads + h] = v;
}

__device__ __forceinline__ float head_sum(const float *s_sum, const float *s_red, int q, int heads, int h, int wph)
{
    if (wph == 1)
        return s_sum[q * heads + h];
    float s = 0.0f;
    for (int j = 0; j < wph; j++)
        s += s_red[q * WARPS + h * wph + j];
    return s;
}

/* Stores VEC gradient lanes y at p, or with accumulate adds them to what
 * p holds, read back just before (so a buffer passed for several
 * gradients sums each). */
__device__ __forceinline__ void put_row(st_t *p, const float (&y)[VEC], bool acc)
{
    float s[VEC];
    if (acc)
        widen(ld_rw(p), s);
#pragma unroll
    for (int e = 0; e < VEC; e++)
        s[e] = acc ? s[e] + y[e] : y[e];
    store_row(p, s);
}

/* The token's share v of a group's fp32 workspace row at p: the group's
 * first token writes it, the others add. Only this thread touches these
 * elements; 16-byte accesses where VEC allows (the rows start 16-byte
 * aligned and d is a multiple of 4 then). */
__device__ __forceinline__ void add_ws(float *p, const float (&v)[VEC], bool first)
{
    if (VEC % 4 == 0) {
#pragma unroll
        for (int e = 0; e < VEC; e += 4) {
            float4 *q = reinterpret_cast<float4 *>(p + e);
            float4 s = make_float4(v[e], v[e + 1], v[e + 2], v[e + 3]);
            if (!first) {
                const float4 o = *q;
                s.x += o.x, s.y += o.y, s.z += o.z, s.w += o.w;
            }
            *q = s;
        }
    } else {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            p[e] = first ? v[e] : p[e] + v[e];
    }
}

/* The tokens of group g. Dynamic shared memory s_tab: NQ * heads per-head
 * sums (3 plain, 5 with the epilogue), then p2 and dx per head, and with
 * the epilogue q per head (TABLES heads' worth in all); then s_red,
 * NSUM * WARPS per-warp sums (room for MAX_WARPS), and s_sc, the token's
 * scalars: r, c, and with the epilogue rs and rs^3 <dnormed gain, y> / d. */
template <bool EPI>
__device__ __forceinline__ void group_tokens(const attnres_cuda_phase2_backward_args &a, float *s_tab)
{
    constexpr int NQ = EPI ? 5 : 3, TABLES = EPI ? 8 : 5;
    const int heads = a.heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = (int)a.d, hd = d / heads, hv = hd / VEC, dv = d / VEC;
    const float inv_d = __fdividef(1.0f, (float)d);
    const head_split m = split_heads(heads, warp, lane);
    float *s_sum = s_tab, *s_p2 = s_tab + NQ * heads, *s_dx = s_p2 + heads, *s_q = s_dx + heads;
    float *s_red = s_tab + TABLES * heads, *s_sc = s_red + NSUM * MAX_WARPS;
    const ar_i64 g = blockIdx.x;
    const ar_i64 t0 = g * a.group;
    const ar_i64 t1 = t0 + a.group < a.T ? t0 + a.group : a.T;
    float *du = a.ws_du + g * a.d;
    float *dg = EPI ? a.ws_dgout + g * a.d : nullptr;
    const bool acc = a.accumulate != 0;

    for (ar_i64 tok = t0; tok < t1; tok++) {
        const bool first = tok == t0;
        const st_t *brow = (const st_t *)a.partial + tok * a.partial_stride;
        const st_t *orow = (const st_t *)a.o1 + tok * a.o1_stride;
        /* dout may be NULL only with the epilogue (a loss of normed alone). */
        const st_t *go = a.dout ? (const st_t *)a.dout + tok * a.dout_stride : nullptr;
        const st_t *dnrow = EPI ? (const st_t *)a.dnormed + tok * a.dnormed_stride : nullptr;
        const float *lse = a.lse + tok * a.lse_stride;
        float *dl = a.dlse + tok * a.dlse_stride;

        /* Sweep 1: b's sum of squares and q per head, and without the
         * epilogue pi = <dout, b - o1>. */
        for (int h = m.h0; h < heads; h += m.G) {
            float ss = 0.0f, dq = 0.0f, pi = 0.0f;
            for (int v = m.v0; v < hv; v += m.vstep) {
                const int k = h * hd + v * VEC;
                float x[VEC], u[VEC];
                widen(ld_ro(brow + k), x);
                ld_f32(a.query + k, u);
                if (EPI) {
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        ss = fmaf(x[e], x[e], ss);
                        dq = fmaf(x[e], u[e], dq);
                    }
                } else {
                    float o[VEC], gv[VEC];
                    widen(ld_ro(orow + k), o);
                    widen(ld_ro(go + k), gv);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        ss = fmaf(x[e], x[e], ss);
                        dq = fmaf(x[e], u[e], dq);
                        pi = fmaf(gv[e], x[e] - o[e], pi);
                    }
                }
            }
            ss = warp_sum(ss);
            dq = warp_sum(dq);
            if (!EPI)
                pi = warp_sum(pi);
            if (lane == 0) {
                put_sum(s_sum, s_red, 0, heads, h, m, ss);
                put_sum(s_sum, s_red, 1, heads, h, m, dq);
                if (!EPI)
                    put_sum(s_sum, s_red, 2, heads, h, m, pi);
            }
        }
        __syncthreads();

        if (!EPI) {
            /* Warp 0: r, then per head p2, dx (and -dx for lse), and c. */
            if (warp == 0) {
                float ss = 0.0f;
                for (int h = lane; h < heads; h += 32)
                    ss += head_sum(s_sum, s_red, 0, heads, h, m.wph);
                const float r = rsqrtf(warp_sum(ss) * inv_d + a.eps);
                float c = 0.0f;
                for (int h = lane; h < heads; h += 32) {
                    const float q = head_sum(s_sum, s_red, 1, heads, h, m.wph);
                    const float pi = head_sum(s_sum, s_red, 2, heads, h, m.wph);
                    const float p2 = sigmoid(a.scale * r * q - lse[h]);
                    const float dx = p2 * (1.0f - p2) * pi;
                    dl[h] = acc ? dl[h] - dx : -dx;
                    s_p2[h] = p2;
                    s_dx[h] = dx;
                    c = fmaf(dx, q, c);
                }
                c = warp_sum(c);
                if (lane == 0) {
                    s_sc[0] = r;
                    s_sc[1] = c;
                }
            }
            __syncthreads();
        } else {
            /* Warp 0: r, then per head q and p2. */
            if (warp == 0) {
                float ss = 0.0f;
                for (int h = lane; h < heads; h += 32)
                    ss += head_sum(s_sum, s_red, 0, heads, h, m.wph);
                const float r = rsqrtf(warp_sum(ss) * inv_d + a.eps);
                for (int h = lane; h < heads; h += 32) {
                    const float q = head_sum(s_sum, s_red, 1, heads, h, m.wph);
                    s_q[h] = q;
                    s_p2[h] = sigmoid(a.scale * r * q - lse[h]);
                }
                if (lane == 0)
                    s_sc[0] = r;
            }
            __syncthreads();
            /* Pass A: out recomputed, y = o1 + p2 (b - o1), and per head
             * sum y^2, <dnormed gain, y> and pi's three parts. */
            for (int h = m.h0; h < heads; h += m.G) {
                const float p2 = s_p2[h];
                float yy = 0.0f, yd = 0.0f, pg = 0.0f, pn = 0.0f, py = 0.0f;
                for (int v = m.v0; v < hv; v += m.vstep) {
                    const int k = h * hd + v * VEC;
                    float o[VEC], x[VEC], dn[VEC], gn[VEC], gv[VEC] = {0.0f};
                    widen(ld_ro(orow + k), o);
                    widen(ld_ro(brow + k), x);
                    widen(ld_ro(dnrow + k), dn);
                    ld_f32(a.out_gain + k, gn);
                    if (go)
                        widen(ld_ro(go + k), gv);
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const float w = x[e] - o[e], y = o[e] + p2 * w, dng = dn[e] * gn[e];
                        yy = fmaf(y, y, yy);
                        yd = fmaf(y, dng, yd);
                        pg = fmaf(gv[e], w, pg);
                        pn = fmaf(dng, w, pn);
                        py = fmaf(y, w, py);
                    }
                }
                yy = warp_sum(yy);
                yd = warp_sum(yd);
                pg = warp_sum(pg);
                pn = warp_sum(pn);
                py = warp_sum(py);
                if (lane == 0) {
                    put_sum(s_sum, s_red, 0, heads, h, m, yy);
                    put_sum(s_sum, s_red, 1, heads, h, m, yd);
                    put_sum(s_sum, s_red, 2, heads, h, m, pg);
                    put_sum(s_sum, s_red, 3, heads, h, m, pn);
                    put_sum(s_sum, s_red, 4, heads, h, m, py);
                }
            }
            __syncthreads();
            /* Warp 0: rs and the norm's coefficient, then per head pi, dx
             * (and -dx for lse), and c. */
            if (warp == 0) {
                float yy = 0.0f, yd = 0.0f;
                for (int h = lane; h < heads; h += 32) {
                    yy += head_sum(s_sum, s_red, 0, heads, h, m.wph);
                    yd += head_sum(s_sum, s_red, 1, heads, h, m.wph);
                }
                const float rs = rsqrtf(warp_sum(yy) * inv_d + a.out_eps);
                const float coef = rs * rs * rs * warp_sum(yd) * inv_d;
                float c = 0.0f;
                for (int h = lane; h < heads; h += 32) {
                    const float pi = head_sum(s_sum, s_red, 2, heads, h, m.wph) +
                                     rs * head_sum(s_sum, s_red, 3, heads, h, m.wph) -
                                     coef * head_sum(s_sum, s_red, 4, heads, h, m.wph);
                    const float p2 = s_p2[h], dx = p2 * (1.0f - p2) * pi;
                    dl[h] = acc ? dl[h] - dx : -dx;
                    s_dx[h] = dx;
                    c = fmaf(dx, s_q[h], c);
                }
                c = warp_sum(c);
                if (lane == 0) {
                    s_sc[1] = c;
                    s_sc[2] = rs;
                    s_sc[3] = coef;
                }
            }
            __syncthreads();
        }

        /* Sweep 2: thread tid owns elements tid, tid + THREADS, ... (in
         * vectors) of every row, for every token of the group. */
        const float r = s_sc[0], c = s_sc[1];
        const float rs = EPI ? s_sc[2] : 0.0f, coef = EPI ? s_sc[3] : 0.0f;
        const float sr = a.scale * r, xr = sr * r * r * c * inv_d;
        st_t *do1 = (st_t *)a.do1 + tok * a.do1_stride;
        st_t *db = (st_t *)a.dpartial + tok * a.dpartial_stride;
        st_t *ds = a.dsublayer ? (st_t *)a.dsublayer + tok * a.dsublayer_stride : nullptr;
        for (int j = tid; j < dv; j += THREADS) {
            const int k = j * VEC, h = k / hd;
            const float p2 = s_p2[h], om = 1.0f - p2, zu = sr * s_dx[h];
            float x[VEC], u[VEC], gk[VEC];
            widen(ld_ro(brow + k), x);
            ld_f32(a.query + k, u);
            if (EPI) {
                /* G from out recomputed, and the token's share of
                 * d(out_gain). */
                float o[VEC], dn[VEC], gn[VEC], gv[VEC] = {0.0f}, dgk[VEC];
                widen(ld_ro(orow + k), o);
                widen(ld_ro(dnrow + k), dn);
                ld_f32(a.out_gain + k, gn);
                if (go)
                    widen(ld_ro(go + k), gv);
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const float y = o[e] + p2 * (x[e] - o[e]), rd = rs * dn[e];
                    gk[e] = gv[e] + rd * gn[e] - coef * y;
                    dgk[e] = rd * y;
                }
                add_ws(dg + k, dgk, first);
            } else {
                widen(ld_ro(go + k), gk);
            }
            float y1[VEC], y2[VEC], duk[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                y1[e] = gk[e] * om;
                y2[e] = p2 * gk[e] + zu * u[e] - xr * x[e];
                duk[e] = zu * x[e];
            }
            add_ws(du + k, duk, first);
            put_row(do1 + k, y1, acc);
            put_row(db + k, y2, acc);
            if (ds)
                put_row(ds + k, y2, acc);
        }
    }
}

/* One block per token group; the plain path and the epilogue's are entries
 * of their own, so that each is given the registers it needs alone. */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_phase2_backward_args a)
{
    extern __shared__ __align__(16) float s_tab[];
    group_tokens<false>(a, s_tab);
}

/* The same with the output-norm epilogue (the runtime launches it for a
 * problem with one). */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}_epi(const attnres_cuda_phase2_backward_args a)
{
    extern __shared__ __align__(16) float s_tab[];
    group_tokens<true>(a, s_tab);
}

/* The second pass: one thread per element of dquery (and of d(out_gain)
 * with the epilogue), the groups' rows added in group order. With no
 * groups (T = 0) every sum is zero. */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}_sum(const attnres_cuda_phase2_backward_args a)
{
    const ar_i64 k = (ar_i64)blockIdx.x * THREADS + threadIdx.x;
    if (k >= a.d)
        return;
    float s = 0.0f;
#pragma unroll 4
    for (ar_i64 g = 0; g < a.groups; g++)
        s += a.ws_du[g * a.d + k];
    a.dquery[k] = s;
    if (a.dout_gain) {
        s = 0.0f;
#pragma unroll 4
        for (ar_i64 g = 0; g < a.groups && a.ws_dgout; g++)
            s += a.ws_dgout[g * a.d + k];
        a.dout_gain[k] = s;
    }
}
]]

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local src = "/* Generated by attnres-gen from templates/cuda/phase2_backward.lua (variant " .. T.id(p) .. "). */\n" ..
    "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" .. kabi.struct("cuda_phase2_backward") .. "\n" ..
    gen.subst(KERNEL, { THREADS = p.threads, NAME = name, NSUM = NSUM, MAX_WARPS = MAX_WARPS })
  return src, name
end

return T
