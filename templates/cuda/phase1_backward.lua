-- cuda/phase1_backward.lua: the backward of Block AttnRes phase 1 (DESIGN
-- §1b) as CUDA C++ for NVRTC: the n sources of one block against its S
-- sites' folded queries, any H, n <= 64, S <= 64. The CPU's counterpart is
-- cpu/phase1_backward.lua; both share the runtime's workspace layout
-- (runtime/src/device.h, ar_mix_backward_workspace with a row of S * d:
-- group g's row for site j at (g * S + j) * d).
--
-- Two entries in one module, both taking the same by-value struct
-- (lib/kernel_abi.lua, cuda_phase1_backward):
--   attnres_<id>      one block per token group (a.group tokens, fixed by
--                     the runtime for every kernel), the group's tokens in
--                     order. Per token:
--                       sweep 1, one warp per tile of (head h, UI = 4
--                         sources, SJ sites): over the head's slice, each
--                         source's sum of squares and its dots q with the
--                         sites' queries u_j and p with their do1_j, the
--                         tile's loads shared by its UI x SJ pairs;
--                       r per source (rsqrt of the mean of its heads'
--                         sums), then one thread per (site, head): the
--                         softmax weights a over the sources, delta =
--                         sum_i a p, and dz = a ((p - delta) + dlse), p -
--                         delta first so that n = 1 gives dz = dlse to the
--                         bit (zero without dlse: exactly-zero query
--                         gradients); per source c = sum over sites and
--                         heads of dz q;
--                       sweep 2, each thread its own VEC-element chunks of
--                         every row, the same chunks for every token:
--                           dv_i = sum_j (a do1_j + scale r_i dz u_j)
--                                  - scale r_i^3 c_i v_i / d,
--                         UI sources at a time, written or added (storage
--                         type, or fp32 with dsrc_f32); then the token's
--                         share of each site's du_j, sum_i scale r_i dz v_i,
--                         SJ sites at a time, added into the group's fp32
--                         row of the workspace (written on the group's
--                         first token).
--   attnres_<id>_sum  the second pass: element e < S * d of dqueries is
--                     the sum of the groups' rows at e in group order
--                     (zero for no groups, T = 0).
--
-- Determinism without atomics: a workspace element is only ever touched
-- by one thread (sweep 2 gives each thread the same chunks for every token
-- of its block), the tokens of a group run in order, and the second pass
-- adds the groups in order. So every gradient is the same on every run,
-- whatever the grid's schedule; the PTX has no atom. or red. instruction.
-- Two source gradients that are one view (with accumulation) are added
-- into by one thread, each load after the previous store.
--
-- Dynamic shared memory, the per-token tables (the runtime's
-- ar_cuda_phase1_backward_smem, runtime/src/cuda_args_phase1_backward.c,
-- writes the same formula): three of n * S * H floats, each entry at
-- (i * S + j) * H + h: s_q (the dots with u, then dz q), s_p (the dots with
-- do1, then scale r dz) and s_a (the softmax weights; before the softmax
-- entry (i, 0, h) holds source i's sum of squares over head h); then s_r
-- (1/rms) and s_c (scale r^3 c / d), n floats each:
--   (3 n S H + 2 n) * 4 bytes,
-- which the runtime bounds by 48 KiB (AR_CUDA_PHASE_BACKWARD_MAX_SMEM):
-- n S H at most (12288 - 2 n) / 3, from 4053 (n = 64) to 4095 (n = 1);
-- K3's block (n = 9, S = 24, H = 1) takes 2664 bytes.
-- No static shared memory.
--
-- Cost per token (DRAM meaning what a row costs the first time it is read,
-- the rest hits L1 or L2):
--   DRAM   the n source rows and S do1 rows read once, S H floats of dlse,
--          the n gradient rows written (and read with accumulation).
--   L1/L2  sweep 1 re-reads each source slice ceil(S / SJ) times and each
--          do1 row and query ceil(n / 4) times; sweep 2 re-reads do1 and
--          the queries ceil(n / 4) times more, and its thread's chunks of
--          the source rows ceil(S / SJ) times (just loaded: L1). The S
--          queries (S d fp32) are the same for every token: L2.
--   workspace  S d fp32 read and written per token (written only on a
--          group's first token), 8 S d bytes, in L2 while the group runs:
--          the price of owning each du element by one thread without
--          atomics, and the largest single cost. At K3's block shape (bf16,
--          d = 7168, n = 8, S = 24) that is 1.38 MB of L2 traffic a token
--          against 0.57 MB of DRAM rows. The sum pass reads the groups'
--          rows once: S d 4 bytes per 32 tokens.
--   math   about 5 n S d FMAs (2 in sweep 1, 3 in sweep 2).
-- The design keeps every per-token value in 48 KiB of tables; cheaper du
-- traffic would need several tokens' tables at once (sweep 2 over two
-- tokens halves it) or du in registers (S * d / threads floats a thread).
-- Sweep 1 has H ceil(n / 4) ceil(S / SJ) warp tiles: at K3's shape 12
-- (SJ = 4), so 512 threads leave warps idle there while sweep 2 uses them
-- all.
--
-- Parameters and why they matter:
--   threads  threads per block: warps for sweep 1's tiles and elements in
--            flight in sweep 2, against idle threads when d is small.
--   vec      elements per load: 1 (any alignment, any head width) or a
--            16-byte load.
--   sj       sites per sweep-1 tile and per du pass of sweep 2: more reuse
--            of each loaded source chunk and fewer re-reads, against
--            registers (2 * 4 * sj dot accumulators; sj * vec du sums).
--
-- Numerics: fp32 after loading, as lib/cuda_mix.lua (rsqrtf, __fdividef,
-- expf, a running max from -1e30f); 64-bit token and workspace offsets.

local template = require("lib/template")
local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")
local kabi = require("lib/kernel_abi")
local mix = require("lib/cuda_mix")

local MAX_SOURCES = kabi.const.AR_CUDA_PHASE1_MAX_SOURCES
local MAX_SITES = kabi.const.AR_CUDA_PHASE1_MAX_SITES
-- Dynamic shared memory a launch may use without an opt-in: 48 KiB
-- (AR_CUDA_PHASE_BACKWARD_MAX_SMEM).
local MAX_SMEM_BYTES = 48 * 1024

-- The tables' bytes; runtime/src/cuda_args_phase1_backward.c has the same.
local function smem_bytes(n, s, h)
  return (3 * n * s * h + 2 * n) * 4
end

local T = template.new("cuda", "phase1_backward", {
  { name = "threads", values = { 128, 256, 512 } },
  { name = "vec", values = { 1, 4, 8 } },
  { name = "sj", values = { 2, 4 } },
}, {
  -- The runtime's built-in fallback: scalar loads (any alignment, any head
  -- width), any d and H within the shared memory bound.
  generic = { threads = 256, vec = 1, sj = 4 },
})

T.constraint = space.scalar_or_16_bytes

function T.id(p)
  return string.format("phase1_backward_cu_%s_b%d_v%d_s%d", p.dtype, p.threads, p.vec, p.sj)
end

function T.launch(p)
  local l = kabi.launch("cuda_phase1_backward")
  l.block = p.threads
  -- A block runs a whole token group; the runtime sizes the grid by
  -- groups, not by this.
  l.tokens_per_block = 1
  -- The tables in dynamic shared memory are sized by the runtime from n,
  -- S and H; nothing static.
  l.smem = 0
  l.align = p.vec * storage.esize[p.dtype] -- bytes: sources, do1, dsrc
  l.qalign = math.min(p.vec * 4, 16) -- bytes: the queries, and fp32 dsrc
  l.max_sources = MAX_SOURCES
  l.max_sites = MAX_SITES
  l.dmax = 0
  l.default = (p.threads == 256 and p.vec * storage.esize[p.dtype] == 16 and p.sj == 4) and 1 or 0
  return l
end

function T.applies(p, problem, device)
  local ok, why = space.applies(T, p, problem, device, { max_sources = MAX_SOURCES, max_sites = MAX_SITES })
  if not ok then return false, why end
  local bytes = smem_bytes(problem.n, problem.s, problem.heads)
  if bytes > MAX_SMEM_BYTES then
    return false, string.format("the tables take (3 n S H + 2 n) * 4 = %d bytes of shared memory, over %d",
                                bytes, MAX_SMEM_BYTES)
  end
  return true
end

-- ---- emitted code -------------------------------------------------------

local KERNEL = [[
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int SJ = ${SJ}; /* sites per sweep-1 tile and per du pass */
constexpr int UI = 4;     /* sources per sweep-1 tile and per dv pass */

__device__ __forceinline__ const st_t *source_row(const attnres_cuda_phase1_backward_args &a, int i, ar_i64 tok)
{
    return (const st_t *)a.src[i] + tok * a.src_stride[i];
}

__device__ __forceinline__ const st_t *do1_row(const attnres_cuda_phase1_backward_args &a, int j, ar_i64 tok)
{
    return (const st_t *)a.do1[j] + tok * a.do1_stride;
}

/* One float of a dlse row; asm volatile, so it stays inside its guard. */
__device__ __forceinline__ float ld_one_f32(const float *p)
{
    float f;
    asm volatile("ld.global.nc.f32 %0, [%1];" : "=f"(f) : "l"(p));
    return f;
}

${F32_ROWS}

${DEPTH_STATS}

/* Sweep 1 for one token: one warp per tile of (head, UI sources, SJ
 * sites). Writes s_q and s_p at (i * sites + j) * heads + h, and the tile
 * of the first sites each source's sum of squares over the head at s_a's
 * entry (i, 0, h). */
__device__ __forceinline__ void sweep1(const attnres_cuda_phase1_backward_args &a, ar_i64 tok, float *s_q,
                                       float *s_p, float *s_a)
{
    const int n = a.n, heads = a.heads, sites = a.s;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int hd = (int)a.d / heads, hv = hd / VEC;
    const int nib = (n + UI - 1) / UI, njb = (sites + SJ - 1) / SJ;
    for (int t = warp; t < heads * nib * njb; t += WARPS) {
        const int jb = t % njb, ib = (t / njb) % nib, h = t / (njb * nib);
        const int i0 = ib * UI, j0 = jb * SJ;
        const ar_i64 kb = (ar_i64)h * hd;
        float ss[UI], dq[UI][SJ], dp[UI][SJ];
#pragma unroll
        for (int q = 0; q < UI; q++) {
            ss[q] = 0.0f;
#pragma unroll
            for (int jj = 0; jj < SJ; jj++)
                dq[q][jj] = 0.0f, dp[q][jj] = 0.0f;
        }
        for (int v = lane; v < hv; v += 32) {
            const ar_i64 k = kb + (ar_i64)v * VEC;
            float x[UI][VEC];
#pragma unroll
            for (int q = 0; q < UI; q++) {
                widen(i0 + q < n ? ld_ro(source_row(a, i0 + q, tok) + k) : raw_zero(), x[q]);
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    ss[q] = fmaf(x[q][e], x[q][e], ss[q]);
            }
#pragma unroll
            for (int jj = 0; jj < SJ; jj++) {
                if (j0 + jj < sites) {
                    float u[VEC], o[VEC];
                    ld_f32(a.queries + (ar_i64)(j0 + jj) * a.d + k, u);
                    widen(ld_ro(do1_row(a, j0 + jj, tok) + k), o);
#pragma unroll
                    for (int q = 0; q < UI; q++)
#pragma unroll
                        for (int e = 0; e < VEC; e++) {
                            dq[q][jj] = fmaf(x[q][e], u[e], dq[q][jj]);
                            dp[q][jj] = fmaf(x[q][e], o[e], dp[q][jj]);
                        }
                }
            }
        }
#pragma unroll
        for (int q = 0; q < UI; q++) {
            ss[q] = warp_sum(ss[q]);
#pragma unroll
            for (int jj = 0; jj < SJ; jj++) {
                dq[q][jj] = warp_sum(dq[q][jj]);
                dp[q][jj] = warp_sum(dp[q][jj]);
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int q = 0; q < UI; q++) {
                if (i0 + q < n) {
                    const int base = ((i0 + q) * sites + j0) * heads + h;
                    if (jb == 0)
                        s_a[(i0 + q) * sites * heads + h] = ss[q];
#pragma unroll
                    for (int jj = 0; jj < SJ; jj++)
                        if (j0 + jj < sites) {
                            s_q[base + jj * heads] = dq[q][jj];
                            s_p[base + jj * heads] = dp[q][jj];
                        }
                }
            }
        }
    }
}

/* Sweep 2 for one token at chunk k (VEC elements of head h) of every row:
 * the source gradients, UI sources at a time, then each site's share of
 * du, SJ sites at a time, into the group's rows du (site j's at j * d). */
__device__ __forceinline__ void sweep2(const attnres_cuda_phase1_backward_args &a, ar_i64 tok, int k, int h,
                                       bool first, const float *s_p, const float *s_a, const float *s_c, float *du)
{
    const int n = a.n, heads = a.heads, sites = a.s, sh = sites * heads;
    for (int i0 = 0; i0 < n; i0 += UI) {
        float y[UI][VEC];
#pragma unroll
        for (int q = 0; q < UI; q++) {
            float x[VEC];
            widen(i0 + q < n ? ld_ro(source_row(a, i0 + q, tok) + k) : raw_zero(), x);
            const float xr = i0 + q < n ? s_c[i0 + q] : 0.0f;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                y[q][e] = -xr * x[e];
        }
        for (int j = 0; j < sites; j++) {
            float o[VEC], u[VEC];
            widen(ld_ro(do1_row(a, j, tok) + k), o);
            ld_f32(a.queries + (ar_i64)j * a.d + k, u);
#pragma unroll
            for (int q = 0; q < UI; q++) {
                if (i0 + q < n) {
                    const int at = (i0 + q) * sh + j * heads + h;
                    const float wa = s_a[at], z = s_p[at];
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        y[q][e] = fmaf(wa, o[e], fmaf(z, u[e], y[q][e]));
                }
            }
        }
        /* One source at a time, its load after the previous store: two
         * gradients may be one view when they are accumulated into. */
#pragma unroll
        for (int q = 0; q < UI; q++) {
            const int i = i0 + q;
            if (i < n) {
                if (a.dsrc_f32) {
                    float *row = (float *)a.dsrc[i] + tok * a.dsrc_stride[i] + k;
                    if (a.accumulate) {
                        float g[VEC];
                        ld_rw_f32(row, g);
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            y[q][e] += g[e];
                    }
                    st_f32(row, y[q]);
                } else {
                    st_t *row = (st_t *)a.dsrc[i] + tok * a.dsrc_stride[i] + k;
                    if (a.accumulate) {
                        float g[VEC];
                        widen(ld_rw(row), g);
#pragma unroll
                        for (int e = 0; e < VEC; e++)
                            y[q][e] += g[e];
                    }
                    store_row(row, y[q]);
                }
            }
        }
    }
    for (int j0 = 0; j0 < sites; j0 += SJ) {
        float acc[SJ][VEC];
#pragma unroll
        for (int jj = 0; jj < SJ; jj++)
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[jj][e] = 0.0f;
        for (int i = 0; i < n; i++) {
            float x[VEC];
            widen(ld_ro(source_row(a, i, tok) + k), x);
            const float *zi = s_p + i * sh + j0 * heads + h;
#pragma unroll
            for (int jj = 0; jj < SJ; jj++) {
                const float z = j0 + jj < sites ? zi[jj * heads] : 0.0f;
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[jj][e] = fmaf(z, x[e], acc[jj][e]);
            }
        }
#pragma unroll
        for (int jj = 0; jj < SJ; jj++) {
            if (j0 + jj < sites) {
                float *row = du + (ar_i64)(j0 + jj) * a.d + k;
                if (!first) {
                    float g[VEC];
                    ld_rw_f32(row, g);
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        acc[jj][e] += g[e];
                }
                st_f32(row, acc[jj]);
            }
        }
    }
}

/* One block per token group. Dynamic shared memory: the tables s_q, s_p
 * and s_a, n * S * H floats each, then s_r and s_c, n floats each (see the
 * template's header). */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_phase1_backward_args a)
{
    extern __shared__ __align__(16) float s_tab[];
    const int n = a.n, heads = a.heads, sites = a.s, sh = sites * heads;
    float *s_q = s_tab, *s_p = s_q + n * sh, *s_a = s_p + n * sh;
    float *s_r = s_a + n * sh, *s_c = s_r + n;
    const int tid = threadIdx.x;
    const int d = (int)a.d, hd = d / heads, dv = d / VEC;
    const float inv_d = __fdividef(1.0f, (float)d), scale = a.scale;
    const ar_i64 g = blockIdx.x;
    const ar_i64 t0 = g * a.group;
    const ar_i64 t1 = t0 + a.group < a.T ? t0 + a.group : a.T;
    /* The group's rows of du, site j's at j * d. */
    float *du = a.ws_du + g * sites * a.d;

    for (ar_i64 tok = t0; tok < t1; tok++) {
        sweep1(a, tok, s_q, s_p, s_a);
        __syncthreads();
        /* 1/rms of each source row, its heads' sums in head order. */
        depth_rms(s_r, s_a, sh, heads, n, inv_d, a.eps, tid, THREADS);
        __syncthreads();
        /* Per (site j, head h), at o = j * heads + h: the weights into s_a,
         * delta = sum_i a p, dz = a ((p - delta) + dlse); then dz q (c's
         * terms) in place of q and scale r dz in place of p. */
        for (int o = tid; o < sh; o += THREADS) {
            const int j = o / heads, h = o - j * heads;
            const float delta = depth_softmax<true>(s_a, s_q, s_p, sh, o, s_r, n, scale);
            const float *dl = a.dlse[j];
            const float lg = dl ? ld_one_f32(dl + tok * a.dlse_stride + h) : 0.0f;
            for (int i = 0; i < n; i++) {
                const int at = i * sh + o;
                const float dz = s_a[at] * ((s_p[at] - delta) + lg);
                s_q[at] = dz * s_q[at];
                s_p[at] = scale * s_r[i] * dz;
            }
        }
        __syncthreads();
        /* c_i over sites and heads in order, kept as scale r^3 c / d, the
         * weight of v_i in its own gradient. */
        for (int i = tid; i < n; i += THREADS) {
            float c = 0.0f;
            for (int o = 0; o < sh; o++)
                c += s_q[i * sh + o];
            const float r = s_r[i];
            s_c[i] = scale * r * r * r * c * inv_d;
        }
        __syncthreads();
        /* Sweep 2: thread tid owns chunks tid, tid + THREADS, ... of every
         * row, for every token of the group. */
        for (int v = tid; v < dv; v += THREADS) {
            const int k = v * VEC;
            sweep2(a, tok, k, k / hd, tok == t0, s_p, s_a, s_c, du);
        }
        __syncthreads(); /* before the next token rewrites the tables */
    }
}

/* The second pass: one thread per element of dqueries ([S, d]), the
 * groups' rows added in group order. With no groups (T = 0) every sum is
 * zero. */
extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}_sum(const attnres_cuda_phase1_backward_args a)
{
    const ar_i64 e = (ar_i64)blockIdx.x * THREADS + threadIdx.x, row = (ar_i64)a.s * a.d;
    if (e < row) {
        float s = 0.0f;
        for (ar_i64 g = 0; g < a.groups; g++)
            s += a.ws_du[g * row + e];
        a.dqueries[e] = s;
    }
}
]]

-- ld_rw_f32 and st_f32: VEC fp32 lanes of a row this kernel writes (fp32
-- source gradients, the workspace), loaded coherently and stored, in
-- accesses of up to four floats; the runtime checks fp32 gradient rows
-- against qalign, min(4 VEC, 16), and the workspace is 16-byte aligned
-- with rows of d floats, a multiple of VEC.
local function f32_rows(vec)
  local w = math.min(vec, 4)
  local suffix = w == 1 and "f32" or ("v" .. w .. ".f32")
  local function list(first, count)
    local r = {}
    for i = 0, count - 1 do r[#r + 1] = "%" .. (first + i) end
    return count == 1 and r[1] or "{" .. table.concat(r, ", ") .. "}"
  end
  local loads, stores = {}, {}
  for base = 0, vec - 1, w do
    local outs, ins = {}, {}
    for i = 0, w - 1 do
      outs[#outs + 1] = string.format('"=f"(f[%d])', base + i)
      ins[#ins + 1] = string.format('"f"(f[%d])', base + i)
    end
    loads[#loads + 1] = string.format('    asm volatile("ld.global.%s %s, [%%%d];" : %s : "l"(p + %d) : "memory");',
                                      suffix, list(0, w), w, table.concat(outs, ", "), base)
    stores[#stores + 1] = string.format('    asm volatile("st.global.%s [%%0], %s;" :: "l"(p + %d), %s : "memory");',
                                        suffix, list(1, w), base, table.concat(ins, ", "))
  end
  return "/* VEC fp32 lanes of a row this kernel writes: coherent load, store. */\n" ..
    "__device__ __forceinline__ void ld_rw_f32(const float *p, float (&f)[VEC])\n{\n" ..
    table.concat(loads, "\n") .. "\n}\n" ..
    "__device__ __forceinline__ void st_f32(float *p, const float (&f)[VEC])\n{\n" ..
    table.concat(stores, "\n") .. "\n}"
end

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local src = "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" .. kabi.struct("cuda_phase1_backward") .. "\n" ..
    gen.subst(KERNEL, { THREADS = p.threads, SJ = p.sj, NAME = name, DEPTH_STATS = mix.DEPTH_STATS,
                        F32_ROWS = f32_rows(p.vec) })
  return src, name
end

return T
