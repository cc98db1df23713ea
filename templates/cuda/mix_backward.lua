-- cuda/mix_backward.lua: the backward of the mix (DESIGN §1b) as CUDA C++
-- for NVRTC, replace and additive forms, any H, N <= 64, with or without
-- the output-norm epilogue. The CPU's counterpart is cpu/mix_backward.lua;
-- both share the runtime's workspace layout (runtime/src/device.h,
-- ar_mix_backward_workspace).
--
-- Three entries in one module, all taking the same by-value struct
-- (lib/kernel_abi.lua, cuda_mix_backward):
--   attnres_<id>      one block per token group (a->group tokens, fixed by
--                     the runtime for every kernel), the group's tokens in
--                     order. Per token:
--                       with the epilogue (out_gain set), the prologue:
--                         the gradient of out, do = dout + the RMSNorm
--                         backward of dnormed through the caller's out,
--                         rr = 1 / rms(out), that is
--                           do = dout + rr dnormed gain
--                                - out rr^3 <dnormed gain, out> / d
--                         (dout may be NULL: zero), in fp32 into shared
--                         memory, and the token's share of d(out_gain),
--                         rr dnormed out, added into the group's fp32 row
--                         of the workspace; without it, do is dout;
--                       sweep 1, one warp per (source, head): the head's
--                         sum of squares, its dot q with the query u and
--                         its dot p' with do;
--                       r per source, then per head the softmax weights a,
--                         delta' = sum_n a p' and the score gradients
--                         dz = a alpha (p' - delta'), exactly zero for
--                         N = 1; c_n = sum_h dz q per source;
--                       sweep 2, each thread its own elements of every
--                         source row (now mostly in L2): dv = a gm +
--                         scale r (dz u - v r^2 c / d), written or added
--                         (in the storage type, or fp32 with dsrc_f32),
--                         and the token's share of du, scale dz r v, added
--                         into the group's fp32 row of the workspace.
--                     The additive form also writes d(partial) = do and
--                     adds sum_h delta' into the group's d(alpha) slot.
--   attnres_<id>_epi  the same with the output-norm epilogue, the entry
--                     the runtime launches for a problem with one: the
--                     token loop is compiled once for each entry, so the
--                     plain path neither tests for the epilogue nor holds
--                     its registers.
--   attnres_<id>_sum  the second pass: each element of dquery (and of
--                     d(out_gain) with the epilogue) is the sum of the
--                     groups' rows in group order, and d(alpha) the sum of
--                     the groups' slots in group order.
--
-- Determinism without atomics: a workspace element is only ever touched
-- by one thread (sweep 2 and the prologue give each thread the same
-- elements for every token of its block), the tokens of a group run in
-- order, and the second pass adds the groups in order. So every gradient
-- is the same on every run, whatever the grid's schedule; the generated
-- PTX has no atom. or red. instruction (tests/backend_ops/ops_cuda.c
-- checks).
--
-- Parameters and why they matter:
--   threads  threads per block: more warps for sweep 1's (source, head)
--            dots and more elements in flight in sweep 2, at the cost of
--            idle threads when d is small.
--   vec      elements per load: 1 (any alignment, any head width) or a
--            16-byte load.
--   unroll   sources whose rows sweep 2 loads together, to keep loads in
--            flight while the gradients of earlier ones are stored.
--
-- Numerics: fp32 after loading, as lib/cuda_mix.lua (rsqrtf, __fdividef,
-- a running max from -1e30f); 64-bit token offsets.

local template = require("lib/template")
local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")
local kabi = require("lib/kernel_abi")
local mix = require("lib/cuda_mix")

local esize = storage.esize
local MAX_SOURCES = kabi.const.AR_CUDA_MAX_SOURCES

local T = template.new("cuda", "mix_backward", {
  { name = "threads", values = { 128, 256, 512 } },
  { name = "vec", values = { 1, 4, 8 } },
  { name = "unroll", values = { 1, 4 } },
}, {
  -- The runtime's built-in fallback: scalar loads (any alignment, any head
  -- width), any d, any H within the shared memory bound, N <= 64.
  generic = { threads = 256, vec = 1, unroll = 4 },
})

T.constraint = space.scalar_or_16_bytes

function T.id(p)
  return string.format("mix_backward_cu_%s_b%d_v%d_u%d", p.dtype, p.threads, p.vec, p.unroll)
end

function T.launch(p)
  local l = kabi.launch("cuda_mix_backward")
  l.block = p.threads
  -- A block runs a whole token group; the runtime sizes the grid by
  -- groups, not by this.
  l.tokens_per_block = 1
  -- Dynamic shared memory: the per-token tables, and with the epilogue
  -- the token's do row, sized by the runtime from N, H and d
  -- (cuda_args.c); the static part is in the binary.
  l.smem = 0
  l.align = p.vec * esize[p.dtype] -- bytes: sources, dout, dsrc, dpartial, out, dnormed
  l.qalign = math.min(p.vec * 4, 16) -- bytes: the query, out_gain, and fp32 dsrc
  l.max_sources = MAX_SOURCES
  l.dmax = 0
  l.default = mix.sweep_seed(p) and 1 or 0
  return l
end

function T.applies(p, problem, device)
  -- The epilogue's do row in shared memory bounds d with it; the runtime
  -- checks that bound with the tables' (cuda_args.c).
  return space.applies(T, p, problem, device, { max_sources = MAX_SOURCES })
end

-- ---- emitted code -------------------------------------------------------

local KERNEL = [[
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int U = ${U}; /* sources whose rows sweep 2 loads together */

__device__ __forceinline__ const st_t *source_row(const attnres_cuda_mix_backward_args &a, int i, ar_i64 tok)
{
    return (const st_t *)a.src[i] + tok * a.src_stride[i];
}

__device__ __forceinline__ st_t *grad_row(const attnres_cuda_mix_backward_args &a, int i, ar_i64 tok)
{
    return (st_t *)a.dsrc[i] + tok * a.dsrc_stride[i];
}

/* The same row when the caller takes the gradients in fp32 (dsrc_f32):
 * its stride counts floats. */
__device__ __forceinline__ float *grad_row_f32(const attnres_cuda_mix_backward_args &a, int i, ar_i64 tok)
{
    return (float *)a.dsrc[i] + tok * a.dsrc_stride[i];
}

${F32_RW}

${DEPTH_STATS}

/* VEC lanes of the token's gradient of out at element k: dout's row as
 * stored, or with the epilogue the fp32 row that the token's prologue left
 * in shared memory (16-byte aligned, k a multiple of VEC). */
template <bool EPI>
__device__ __forceinline__ void load_go(const st_t *go, const float *s_do, ar_i64 k, float (&o)[VEC])
{
    if (EPI) {
        if (VEC % 4 == 0) {
#pragma unroll
            for (int v = 0; v < VEC; v += 4) {
                const float4 f = *reinterpret_cast<const float4 *>(s_do + k + v);
                o[v] = f.x, o[v + 1] = f.y, o[v + 2] = f.z, o[v + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int v = 0; v < VEC; v++)
                o[v] = s_do[k + v];
        }
    } else {
        widen(ld_ro(go + k), o);
    }
}

/* The tokens of group g. With EPI (the output-norm epilogue) each token
 * first takes its gradient of out, do, into s_do and the sweeps read it
 * there; without, they read dout, and the code is the plain path's own. */
template <bool EPI>
__device__ __forceinline__ void group_tokens(const attnres_cuda_mix_backward_args &a, float *s_tab, float *s_red)
{
    const int n = a.n, heads = a.heads, nh = n * heads;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = (int)a.d;
    const int hd = d / heads, hv = hd / VEC, dv = d / VEC;
    /* With the epilogue do's row comes first, so its float4 loads are
     * aligned; the tables follow. */
    float *s_do = s_tab, *s_q = s_tab + (EPI ? d : 0), *s_g = s_q + nh, *s_w = s_q + 2 * nh;
    float *s_r = s_q + 3 * nh, *s_c = s_r + n, *s_delta = s_c + n;
    const float inv_d = __fdividef(1.0f, (float)d);
    const ar_i64 g = blockIdx.x;
    const ar_i64 t0 = g * a.group;
    const ar_i64 t1 = t0 + a.group < a.T ? t0 + a.group : a.T;
    float *du = a.ws_du + g * a.d;
    float *dg = EPI ? a.ws_dgout + g * a.d : nullptr;
    float dalpha = 0.0f; /* thread 0: the group's sum of d(alpha) */

    for (ar_i64 tok = t0; tok < t1; tok++) {
        const bool first = tok == t0;
        /* dout may be NULL only with the epilogue (a loss of normed alone). */
        const st_t *go = !EPI || a.dout ? (const st_t *)a.dout + tok * a.dout_stride : nullptr;
        if (EPI) {
            /* The prologue: rr = 1 / rms(out), the block's sums of out^2 and
             * of dnormed gain out in warp order; then do = dout + rr dnormed
             * gain - out rr^3 <dnormed gain, out> / d into s_do, and the
             * token's share of d(out_gain), rr dnormed out, into the group's
             * row, each thread on the elements it owns in sweep 2. */
            const st_t *orow = (const st_t *)a.out + tok * a.out_stride;
            const st_t *dnrow = (const st_t *)a.dnormed + tok * a.dnormed_stride;
            float s0 = 0.0f, s1 = 0.0f;
            for (int j = tid; j < dv; j += THREADS) {
                const int k = j * VEC;
                float x[VEC], dn[VEC], gn[VEC];
                widen(ld_ro(orow + k), x);
                widen(ld_ro(dnrow + k), dn);
                ld_f32(a.out_gain + k, gn);
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    s0 = fmaf(x[v], x[v], s0);
                    s1 = fmaf(x[v], dn[v] * gn[v], s1);
                }
            }
            s0 = warp_sum(s0);
            s1 = warp_sum(s1);
            if (lane == 0) {
                s_red[warp] = s0;
                s_red[WARPS + warp] = s1;
            }
            __syncthreads();
            float ss = 0.0f, dot = 0.0f;
            for (int w = 0; w < WARPS; w++) {
                ss += s_red[w];
                dot += s_red[WARPS + w];
            }
            const float rr = rsqrtf(ss * inv_d + a.out_eps);
            const float coef = rr * rr * rr * dot * inv_d;
            for (int j = tid; j < dv; j += THREADS) {
                const int k = j * VEC;
                float x[VEC], dn[VEC], gn[VEC], o[VEC] = {0.0f};
                widen(ld_ro(orow + k), x);
                widen(ld_ro(dnrow + k), dn);
                ld_f32(a.out_gain + k, gn);
                if (go)
                    widen(ld_ro(go + k), o);
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    const float rd = rr * dn[v];
                    s_do[k + v] = o[v] + rd * gn[v] - coef * x[v];
                    dg[k + v] = first ? rd * x[v] : dg[k + v] + rd * x[v];
                }
            }
            __syncthreads(); /* s_do is whole before the sweeps read it */
        }
        /* Sweep 1: one warp per (source, head). */
        for (int p = warp; p < nh; p += WARPS) {
            const int i = p / heads, h = p - i * heads;
            const ar_i64 kb = (ar_i64)h * hd;
            const st_t *row = source_row(a, i, tok) + kb;
            float ss = 0.0f, dq = 0.0f, dp = 0.0f;
            for (int j = lane; j < hv; j += 32) {
                float x[VEC], u[VEC], o[VEC];
                widen(ld_ro(row + j * VEC), x);
                load_go<EPI>(go, s_do, kb + j * VEC, o);
                ld_f32(a.query + kb + j * VEC, u);
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    ss = fmaf(x[v], x[v], ss);
                    dq = fmaf(x[v], u[v], dq);
                    dp = fmaf(x[v], o[v], dp);
                }
            }
            ss = warp_sum(ss);
            dq = warp_sum(dq);
            dp = warp_sum(dp);
            if (lane == 0) {
                s_w[p] = ss;
                s_q[p] = dq;
                s_g[p] = dp;
            }
        }
        __syncthreads();
        /* 1/rms of each source row, its heads' sums in head order. */
        depth_rms(s_r, s_w, heads, heads, n, inv_d, a.eps, tid, THREADS);
        __syncthreads();
        /* Per head: the weights in s_w (s_q keeps the dots), delta' =
         * sum_n a p', and dz in place of p'. */
        for (int h = tid; h < heads; h += THREADS) {
            const float delta = depth_softmax<true>(s_w, s_q, s_g, heads, h, s_r, n, a.scale);
            for (int i = 0; i < n; i++)
                s_g[i * heads + h] = s_w[i * heads + h] * a.alpha * (s_g[i * heads + h] - delta);
            s_delta[h] = delta;
        }
        __syncthreads();
        /* c_n = sum_h dz q, and the token's d(alpha), in head order. */
        for (int i = tid; i < n; i += THREADS) {
            float c = 0.0f;
            for (int h = 0; h < heads; h++)
                c = fmaf(s_g[i * heads + h], s_q[i * heads + h], c);
            s_c[i] = c;
        }
        if (tid == 0 && a.ws_dalpha) {
            for (int h = 0; h < heads; h++)
                dalpha += s_delta[h];
        }
        __syncthreads();
        /* Sweep 2: thread tid owns elements tid, tid + THREADS, ... of every
         * row, for every token of the group. */
        st_t *dprow = a.dpartial ? (st_t *)a.dpartial + tok * a.dpartial_stride : nullptr;
        for (int j = tid; j < dv; j += THREADS) {
            const int k = j * VEC, h = k / hd;
            float o[VEC], u[VEC], acc[VEC] = {0.0f};
            load_go<EPI>(go, s_do, k, o);
            ld_f32(a.query + k, u);
            for (int i0 = 0; i0 < n; i0 += U) {
                raw_t x[U];
#pragma unroll
                for (int q = 0; q < U; q++)
                    x[q] = i0 + q < n ? ld_ro(source_row(a, i0 + q, tok) + k) : raw_zero();
#pragma unroll
                for (int q = 0; q < U; q++) {
                    const int i = i0 + q;
                    if (i < n) {
                        const float r = s_r[i], z = s_g[i * heads + h];
                        const float wa = s_w[i * heads + h] * a.alpha, sr = a.scale * r;
                        const float rc = r * r * s_c[i] * inv_d, zr = sr * z;
                        float f[VEC], y[VEC];
                        widen(x[q], f);
                        st_t *drow = a.dsrc_f32 ? nullptr : grad_row(a, i, tok) + k;
                        float *frow = a.dsrc_f32 ? grad_row_f32(a, i, tok) + k : nullptr;
                        if (a.accumulate) {
                            if (a.dsrc_f32)
                                ld_rw_f32(frow, y);
                            else
                                widen(ld_rw(drow), y);
                        }
#pragma unroll
                        for (int v = 0; v < VEC; v++) {
                            const float gv = wa * o[v] + sr * (z * u[v] - f[v] * rc);
                            y[v] = a.accumulate ? y[v] + gv : gv;
                            acc[v] = fmaf(zr, f[v], acc[v]);
                        }
                        if (a.dsrc_f32)
                            st_f32(frow, y);
                        else
                            store_row(drow, y);
                    }
                }
            }
#pragma unroll
            for (int v = 0; v < VEC; v++)
                du[k + v] = first ? acc[v] : du[k + v] + acc[v];
            if (dprow) {
                /* The additive form: d(partial) = do (dout without the
                 * epilogue). */
                if (a.accumulate) {
                    float y[VEC];
                    widen(ld_rw(dprow + k), y);
#pragma unroll
                    for (int v = 0; v < VEC; v++)
                        y[v] += o[v];
                    store_row(dprow + k, y);
                } else {
                    store_row(dprow + k, o);
                }
            }
        }
        __syncthreads(); /* before the next token rewrites the tables and s_do */
    }
    if (tid == 0 && a.ws_dalpha)
        a.ws_dalpha[g] = dalpha;
}

/* One block per token group. Dynamic shared memory: with the epilogue, d
 * floats of the token's do; then n * heads floats per table: s_q (dots
 * with u), s_g (dots with do, then dz), s_w (sums of squares per head, then
 * the softmax weights); then s_r and s_c (n each) and s_delta (heads). The
 * plain path and the epilogue's are entries of their own, so that each is
 * given the registers it needs alone (one entry with both took 72 to 104
 * registers for the plain path of bf16_b128_v1_u4, ptxas for sm_90). */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_mix_backward_args a)
{
    extern __shared__ __align__(16) float s_tab[];
    group_tokens<false>(a, s_tab, nullptr);
}

/* The same with the output-norm epilogue (the runtime launches it for a
 * problem with one). */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}_epi(const attnres_cuda_mix_backward_args a)
{
    extern __shared__ __align__(16) float s_tab[];
    __shared__ float s_red[2 * WARPS]; /* the prologue's per-warp sums */
    group_tokens<true>(a, s_tab, s_red);
}

/* The second pass: one thread per element of dquery (and of d(out_gain)
 * with the epilogue), the groups' rows added in group order; thread 0 of
 * block 0 also sums d(alpha). With no groups (T = 0) every sum is zero. */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}_sum(const attnres_cuda_mix_backward_args a)
{
    const ar_i64 k = (ar_i64)blockIdx.x * THREADS + threadIdx.x;
    if (k < a.d) {
        float s = 0.0f;
        for (ar_i64 g = 0; g < a.groups; g++)
            s += a.ws_du[g * a.d + k];
        a.dquery[k] = s;
        if (a.dout_gain) {
            s = 0.0f;
            for (ar_i64 g = 0; g < a.groups && a.ws_dgout; g++)
                s += a.ws_dgout[g * a.d + k];
            a.dout_gain[k] = s;
        }
    }
    if (k == 0 && a.dalpha) {
        float s = 0.0f;
        for (ar_i64 g = 0; g < a.groups && a.ws_dalpha; g++)
            s += a.ws_dalpha[g];
        *a.dalpha = s;
    }
}
]]

-- ld_rw_f32 and st_f32: VEC fp32 lanes of a source gradient row, loaded
-- coherently (the kernel writes these rows) and stored, in accesses of at
-- most 16 bytes; the runtime checks the row against qalign, min(4 VEC, 16).
local function f32_rw_code(vec)
  local step = math.min(vec, 4)
  local ld, st = {}, {}
  for base = 0, vec - 1, step do
    local regs, outs, ins = {}, {}, {}
    for i = 0, step - 1 do
      regs[#regs + 1] = "%" .. i
      outs[#outs + 1] = string.format('"=f"(f[%d])', base + i)
      ins[#ins + 1] = string.format('"f"(f[%d])', base + i)
    end
    local sregs = {}
    for i = 1, step do sregs[#sregs + 1] = "%" .. i end
    local suf = step == 1 and "f32" or string.format("v%d.f32", step)
    local lregs = step == 1 and "%0" or "{" .. table.concat(regs, ", ") .. "}"
    local sl = step == 1 and "%1" or "{" .. table.concat(sregs, ", ") .. "}"
    ld[#ld + 1] = string.format('    asm volatile("ld.global.%s %s, [%%%d];" : %s : "l"(p + %d) : "memory");',
                                suf, lregs, step, table.concat(outs, ", "), base)
    st[#st + 1] = string.format('    asm volatile("st.global.%s [%%0], %s;" :: "l"(p + %d), %s : "memory");',
                                suf, sl, base, table.concat(ins, ", "))
  end
  return "__device__ __forceinline__ void ld_rw_f32(const float *p, float (&f)[VEC])\n{\n" ..
    table.concat(ld, "\n") .. "\n}\n" ..
    "__device__ __forceinline__ void st_f32(float *p, const float (&f)[VEC])\n{\n" ..
    table.concat(st, "\n") .. "\n}"
end

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local src = "/* Generated by attnres-gen from templates/cuda/mix_backward.lua (variant " .. T.id(p) .. "). */\n" ..
    "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" .. kabi.struct("cuda_mix_backward") .. "\n" ..
    gen.subst(KERNEL, { THREADS = p.threads, U = p.unroll, NAME = name, DEPTH_STATS = mix.DEPTH_STATS,
                        F32_RW = f32_rw_code(p.vec) })
  return src, name
end

return T
