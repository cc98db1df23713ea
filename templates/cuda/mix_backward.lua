-- cuda/mix_backward.lua: the backward of the mix (DESIGN §1b) as CUDA C++
-- for NVRTC, replace and additive forms, any H, N <= 64. The CPU's
-- counterpart is cpu/mix_backward.lua; both share the runtime's workspace
-- layout (runtime/src/device.h, ar_mix_backward_workspace).
--
-- Two entries in one module, both taking the same by-value struct
-- (lib/kernel_abi.lua, cuda_mix_backward):
--   attnres_<id>      one block per token group (a->group tokens, fixed by
--                     the runtime for every kernel), the group's tokens in
--                     order. Per token:
--                       sweep 1, one warp per (source, head): the head's
--                         sum of squares, its dot q with the query u and
--                         its dot p' with dout;
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
--                     The additive form also writes d(partial) = dout and
--                     adds sum_h delta' into the group's d(alpha) slot.
--   attnres_<id>_sum  the second pass: each element of dquery is the sum
--                     of the groups' rows in group order, and d(alpha) the
--                     sum of the groups' slots in group order.
--
-- Determinism without atomics: a workspace element is only ever touched
-- by one thread (sweep 2 gives each thread the same elements for every
-- token of its block), the tokens of a group run in order, and the second
-- pass adds the groups in order. So every gradient is the same on every
-- run, whatever the grid's schedule; the generated PTX has no atom. or
-- red. instruction (tests/backend_ops/ops_cuda.c checks).
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
  -- Dynamic shared memory: the per-token tables, sized by the runtime
  -- from N and H (cuda_args.c); the static part is in the binary.
  l.smem = 0
  l.align = p.vec * esize[p.dtype] -- bytes: sources, dout, dsrc, dpartial
  l.qalign = math.min(p.vec * 4, 16) -- bytes: the query, and fp32 dsrc
  l.max_sources = MAX_SOURCES
  l.dmax = 0
  l.default = mix.sweep_seed(p) and 1 or 0
  return l
end

function T.applies(p, problem, device)
  if problem.epilogue and problem.epilogue ~= 0 then
    return false, "no mix_backward kernel for the output-norm epilogue"
  end
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

/* One block per token group. Dynamic shared memory, n * heads floats per
 * table: s_q (dots with u), s_g (dots with dout, then dz), s_w (sums of
 * squares per head, then the softmax weights); then s_r and s_c (n each)
 * and s_delta (heads). */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_mix_backward_args a)
{
    extern __shared__ float s_tab[];
    const int n = a.n, heads = a.heads, nh = n * heads;
    float *s_q = s_tab, *s_g = s_tab + nh, *s_w = s_tab + 2 * nh;
    float *s_r = s_tab + 3 * nh, *s_c = s_r + n, *s_delta = s_c + n;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = (int)a.d;
    const int hd = d / heads, hv = hd / VEC, dv = d / VEC;
    const float inv_d = __fdividef(1.0f, (float)d);
    const ar_i64 g = blockIdx.x;
    const ar_i64 t0 = g * a.group;
    const ar_i64 t1 = t0 + a.group < a.T ? t0 + a.group : a.T;
    float *du = a.ws_du + g * a.d;
    float dalpha = 0.0f; /* thread 0: the group's sum of d(alpha) */

    for (ar_i64 tok = t0; tok < t1; tok++) {
        const st_t *go = (const st_t *)a.dout + tok * a.dout_stride;
        /* Sweep 1: one warp per (source, head). */
        for (int p = warp; p < nh; p += WARPS) {
            const int i = p / heads, h = p - i * heads;
            const ar_i64 kb = (ar_i64)h * hd;
            const st_t *row = source_row(a, i, tok) + kb;
            float ss = 0.0f, dq = 0.0f, dp = 0.0f;
            for (int j = lane; j < hv; j += 32) {
                float x[VEC], u[VEC], o[VEC];
                widen(ld_ro(row + j * VEC), x);
                widen(ld_ro(go + kb + j * VEC), o);
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
        const bool first = tok == t0;
        for (int j = tid; j < dv; j += THREADS) {
            const int k = j * VEC, h = k / hd;
            float o[VEC], u[VEC], acc[VEC] = {0.0f};
            widen(ld_ro(go + k), o);
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
                /* The additive form: d(partial) = dout. */
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
        __syncthreads(); /* before the next token rewrites the tables */
    }
    if (tid == 0 && a.ws_dalpha)
        a.ws_dalpha[g] = dalpha;
}

/* The second pass: one thread per element of dquery, the groups' rows
 * added in group order; thread 0 of block 0 also sums d(alpha). With no
 * groups (T = 0) both sums are zero. */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}_sum(const attnres_cuda_mix_backward_args a)
{
    const ar_i64 k = (ar_i64)blockIdx.x * THREADS + threadIdx.x;
    if (k < a.d) {
        float s = 0.0f;
        for (ar_i64 g = 0; g < a.groups; g++)
            s += a.ws_du[g * a.d + k];
        a.dquery[k] = s;
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
