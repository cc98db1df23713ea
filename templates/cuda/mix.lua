-- cuda/mix.lua: the AttnRes depth mix (DESIGN §1) as CUDA C++ for NVRTC.
--
-- One kernel entry per variant:
--   extern "C" __global__ void attnres_<id>(const attnres_cuda_mix_args a)
-- The argument struct is passed by value (no device allocation per launch,
-- so launches can be captured in CUDA graphs); it must match
-- templates/lib/kernel_abi.lua (cuda_mix). The source needs no headers.
--
-- Schedules (parameter `sched`):
--   reg      online softmax over sources; each thread keeps its slice of the
--            fp32 accumulator row and of the `batch` source rows it is
--            working on in registers, so every source element is read from
--            memory exactly once.
--   pipe     as reg, and the next batch's loads are issued before the
--            current batch's reductions (register double buffering).
--   reread   as reg, but source rows are not kept across the reduction: the
--            accumulate step reads them again (from L1/L2), trading traffic
--            for registers and occupancy.
--   twopass  one block per token, any d and any number of heads: scores
--            first (one warp per source x head), the depth softmax in shared
--            memory, then one sweep over the N rows side by side. Rows are
--            read twice (the second time mostly from L2). The generic
--            (fallback) kernel is a twopass variant.
--
-- Mapping (online schedules): `map` = "warp" gives one warp per token
-- (threads/32 tokens per block, no barriers); "block" gives the whole block
-- to one token. Within a token the G threads are split into H groups of
-- S = G/H, one per head, so each thread's dot product belongs to one head.
-- A thread owns `chunks` vectors of `vec` elements, strided by S*vec: loads
-- are coalesced, the slice is a compile-time size (registers), and d is a
-- run-time value up to dmax = chunks*G*vec (in the variant id as d<dmax>).
--
-- Numerics: fp32 everywhere after loading; the running max starts at -1e30f
-- (never -inf); token offsets are 64-bit; a NaN in one token's source row
-- reaches only that token's output. 1/rms uses rsqrtf and 1/l __fdividef
-- (both within 2 ulp): the IEEE forms call a slow-path subroutine that
-- makes ptxas report spills.

local T = {
  backend = "cuda",
  op = "mix",
  params = {
    { name = "dtype", values = { "f32", "bf16", "f16" } },
    { name = "sched", values = { "reg", "pipe", "reread", "twopass" } },
    { name = "map", values = { "warp", "block" } },
    -- threads per block
    { name = "threads", values = { 128, 256, 512, 1024 } },
    -- elements per load (loads are 2..16 bytes)
    { name = "vec", values = { 1, 2, 4, 8 } },
    -- online: vectors per thread per row, so d <= dmax = chunks*G*vec is a
    -- compile-time bound (d itself stays a run-time value); twopass: 0
    { name = "chunks", values = { 0, 1, 2, 4, 8 } },
    -- online: sources reduced per batch; twopass: sources per unrolled step
    { name = "batch", values = { 1, 2, 4 } },
  },
  -- The runtime's built-in fallback: scalar loads (any alignment, any head
  -- width), any d, any H, N <= 64.
  generic = { sched = "twopass", map = "block", threads = 256, vec = 1, chunks = 0, batch = 4 },
}

local kabi = require("lib/kernel_abi")
local ABI = kabi.version("cuda_mix")
local MAX_SOURCES = kabi.const.AR_CUDA_MAX_SOURCES
local esize = { f32 = 4, bf16 = 2, f16 = 2 }

local function group_threads(p)
  return p.map == "warp" and 32 or p.threads
end

local function dmax(p)
  return p.chunks * group_threads(p) * p.vec
end

-- The query slice stays in registers when it is small; otherwise it is
-- re-read (from L1) for every batch.
local function query_in_registers(p)
  return p.chunks * p.vec <= 16
end

-- Rough 32-bit registers a variant needs: the fp32 accumulator slice, the
-- staged source rows (the compiler keeps them widened to fp32), the query
-- slice when kept, and a fixed overhead. Variants over the per-thread limit
-- that __launch_bounds__ implies would spill: they are not in the space.
local function register_estimate(p)
  local slice = p.chunks * p.vec
  local staged = p.batch * slice
  if p.sched == "pipe" then staged = 2 * staged end
  if p.sched == "reread" then staged = slice end
  return slice + staged + (query_in_registers(p) and slice or 0) + 24
end

function T.constraint(p)
  local vb = p.vec * esize[p.dtype]
  if vb > 16 then return false end
  if p.sched == "twopass" then
    -- scalar loads (any alignment) or 16-byte loads, 8-byte for f32 too
    return p.map == "block" and p.chunks == 0 and p.batch >= 2 and p.threads >= 256
      and p.threads <= 512 and (p.vec == 1 or vb == 16 or (vb == 8 and p.threads == 256 and p.batch == 4))
  end
  if vb ~= 16 or p.chunks == 0 then return false end
  if p.map == "warp" and (p.threads ~= 128 or p.chunks == 1) then return false end
  local dm = dmax(p)
  if dm < 512 or dm > 16384 then return false end
  if p.sched == "pipe" and p.batch > 2 then return false end
  if p.sched == "reread" and p.batch ~= 2 then return false end
  local cap = math.min(255, 65536 // p.threads)
  return register_estimate(p) <= cap
end

function T.id(p)
  return string.format("mix_cu_%s_%s_%s_b%d_v%d_d%d_n%d", p.dtype, p.sched,
                       p.map == "warp" and "warp" or "blk", p.threads, p.vec,
                       dmax(p), p.batch)
end

-- Variants the template proposes as starting points (the tuner's seeds);
-- they must compile without spills on every supported architecture.
local function is_default(p)
  local vb = p.vec * esize[p.dtype]
  local dm = dmax(p)
  if p.sched == "twopass" then return p.threads == 256 and vb == 16 and p.batch == 4 end
  if p.sched == "reg" and p.batch == 2 then
    if p.map == "block" and p.threads == 256 and (dm == 4096 or dm == 8192) then return true end
    if p.map == "warp" and dm == 1024 then return true end
  end
  return p.sched == "pipe" and p.map == "block" and p.threads == 512 and dm == 8192 and p.batch == 1
end

function T.launch(p)
  local vb = p.vec * esize[p.dtype]
  return {
    abi = ABI,
    abi_op = kabi.op("cuda_mix"),
    block = p.threads,
    tokens_per_block = p.map == "warp" and p.threads // 32 or 1,
    smem = 0, -- dynamic shared memory; the static part is in the binary
    align = vb, -- bytes: source/partial/out/normed pointers and strides*size
    qalign = math.min(p.vec * 4, 16), -- bytes: query and out_gain pointers
    max_sources = MAX_SOURCES,
    dmax = dmax(p), -- 0: any d
    default = is_default(p) and 1 or 0,
  }
end

function T.applies(p, problem, device)
  if problem.op ~= "mix" then return false, "not a mix problem" end
  if problem.dtype ~= p.dtype then return false, "dtype differs" end
  if device and device.backend ~= "" and device.backend ~= "cuda" then
    return false, "not a CUDA device"
  end
  local d, H, n = problem.d, problem.heads, problem.n
  if n < 1 or n > MAX_SOURCES then
    return false, string.format("N = %d is outside 1..%d", n, MAX_SOURCES)
  end
  if d < 1 or d > (1 << 30) then return false, "d is outside 1..2^30" end
  if H < 1 or d % H ~= 0 then return false, string.format("%d heads do not divide d = %d", H, d) end
  local hd = d // H
  if hd % p.vec ~= 0 then
    return false, string.format("head width %d is not a multiple of vec = %d", hd, p.vec)
  end
  if p.sched == "twopass" then return true end
  local G = group_threads(p)
  if H > G or G % H ~= 0 then
    return false, string.format("%d heads do not divide the %d threads of a token", H, G)
  end
  local dm = dmax(p)
  if d > dm then return false, string.format("d = %d exceeds dmax = %d", d, dm) end
  if 2 * d <= dm then
    return false, string.format("d = %d would leave over half of the dmax = %d slots idle", d, dm)
  end
  return true
end

-- ---- emitted code -------------------------------------------------------

local PRELUDE = [[
typedef unsigned short ar_u16;
typedef unsigned int ar_u32;
typedef long long ar_i64;

${ARGS}
/* Sum over the lanes whose xor distance is below lim (lim a power of two;
 * 32 or more: the whole warp). Every lane takes part in every shuffle. */
__device__ __forceinline__ float lane_sum(float v, int lim)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        if (off < lim)
            v += o;
    }
    return v;
}
]]

-- Storage helpers: a `raw_t` holds VEC elements as loaded; widen() turns it
-- into fp32, store_row() rounds fp32 back to storage.
local function storage_code(dtype, vec)
  local es = esize[dtype]
  local bytes = vec * es
  local lines = {}
  local function add(s) lines[#lines + 1] = s end
  add(string.format("typedef %s st_t;", dtype == "f32" and "float" or "ar_u16"))
  add(string.format("constexpr int VEC = %d;", vec))
  if bytes == 2 then
    add([[
struct raw_t { ar_u16 h; };
__device__ __forceinline__ raw_t raw_zero() { raw_t r; r.h = 0; return r; }
/* read-only path: sources (never written by this kernel) */
__device__ __forceinline__ raw_t ld_nc(const st_t *p)
{ raw_t r; asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r.h) : "l"(p)); return r; }
/* coherent path: the partial sum, which may alias out */
__device__ __forceinline__ raw_t ld_g(const st_t *p)
{ raw_t r; asm volatile("ld.global.u16 %0, [%1];" : "=h"(r.h) : "l"(p) : "memory"); return r; }
/* a second read of a source: never merged with the first */
__device__ __forceinline__ raw_t ld_again(const st_t *p)
{ raw_t r; asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(r.h) : "l"(p)); return r; }
/* a read of what this block has just stored (after a barrier) */
__device__ __forceinline__ raw_t ld_back(const st_t *p)
{ raw_t r; asm volatile("ld.global.u16 %0, [%1];" : "=h"(r.h) : "l"(p) : "memory"); return r; }
__device__ __forceinline__ void st_raw(st_t *p, raw_t r)
{ asm volatile("st.global.u16 [%0], %1;" :: "l"(p), "h"(r.h) : "memory"); }]])
  else
    local nw = bytes // 4
    local regs, outs, ins = {}, {}, {}
    for i = 0, nw - 1 do
      regs[#regs + 1] = "%" .. i
      outs[#outs + 1] = string.format('"=r"(r.w[%d])', i)
      ins[#ins + 1] = string.format('"r"(r.w[%d])', i)
    end
    local suffix = nw == 1 and "u32" or string.format("v%d.u32", nw)
    local reg_list = nw == 1 and "%0" or "{" .. table.concat(regs, ", ") .. "}"
    local st_list = {}
    for i = 1, nw do st_list[#st_list + 1] = "%" .. i end
    local st_regs = nw == 1 and "%1" or "{" .. table.concat(st_list, ", ") .. "}"
    local v = {
      NW = nw, BYTES = bytes, SUF = suffix, REGS = reg_list, OUTS = table.concat(outs, ", "),
      P = "%" .. nw, INS = table.concat(ins, ", "), SREGS = st_regs,
    }
    add(gen.subst([[
struct alignas(${BYTES}) raw_t { ar_u32 w[${NW}]; };
__device__ __forceinline__ raw_t raw_zero()
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < ${NW}; i++)
        r.w[i] = 0u;
    return r;
}
/* read-only path: sources (never written by this kernel) */
__device__ __forceinline__ raw_t ld_nc(const st_t *p)
{ raw_t r; asm volatile("ld.global.nc.${SUF} ${REGS}, [${P}];" : ${OUTS} : "l"(p)); return r; }
/* coherent path: the partial sum, which may alias out */
__device__ __forceinline__ raw_t ld_g(const st_t *p)
{ raw_t r; asm volatile("ld.global.${SUF} ${REGS}, [${P}];" : ${OUTS} : "l"(p) : "memory"); return r; }
/* a second read of a source: never merged with the first */
__device__ __forceinline__ raw_t ld_again(const st_t *p)
{ raw_t r; asm volatile("ld.global.nc.${SUF} ${REGS}, [${P}];" : ${OUTS} : "l"(p)); return r; }
/* a read of what this block has just stored (after a barrier) */
__device__ __forceinline__ raw_t ld_back(const st_t *p)
{ raw_t r; asm volatile("ld.global.${SUF} ${REGS}, [${P}];" : ${OUTS} : "l"(p) : "memory"); return r; }
__device__ __forceinline__ void st_raw(st_t *p, raw_t r)
{ asm volatile("st.global.${SUF} [%0], ${SREGS};" :: "l"(p), ${INS} : "memory"); }]], v))
  end

  -- widen / narrow
  if dtype == "f32" then
    add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC; i++)
        f[i] = __uint_as_float(r.w[i]);
}
__device__ __forceinline__ void store_row(st_t *p, const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC; i++)
        r.w[i] = __float_as_uint(f[i]);
    st_raw(p, r);
}]])
  elseif dtype == "bf16" then
    add([[
/* bf16 -> fp32 is a shift; fp32 -> bf16 rounds to nearest even, NaN stays NaN. */
__device__ __forceinline__ ar_u32 bf16_bits(float x)
{
#if __CUDA_ARCH__ >= 800
    ar_u16 h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    const ar_u32 u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
#endif
}
__device__ __forceinline__ ar_u32 bf16x2_bits(float lo, float hi)
{
#if __CUDA_ARCH__ >= 800
    ar_u32 w;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
#else
    return bf16_bits(lo) | (bf16_bits(hi) << 16);
#endif
}]])
    if vec == 1 then
      add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{ f[0] = __uint_as_float((ar_u32)r.h << 16); }
__device__ __forceinline__ void store_row(st_t *p, const float (&f)[VEC])
{ raw_t r; r.h = (ar_u16)bf16_bits(f[0]); st_raw(p, r); }]])
    else
      add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) {
        f[2 * i] = __uint_as_float(r.w[i] << 16);
        f[2 * i + 1] = __uint_as_float(r.w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void store_row(st_t *p, const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++)
        r.w[i] = bf16x2_bits(f[2 * i], f[2 * i + 1]);
    st_raw(p, r);
}]])
    end
  else -- f16
    add([[
__device__ __forceinline__ float f16_float(ar_u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ ar_u16 f16_bits(float x)
{
    ar_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}]])
    if vec == 1 then
      add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC]) { f[0] = f16_float(r.h); }
__device__ __forceinline__ void store_row(st_t *p, const float (&f)[VEC])
{ raw_t r; r.h = f16_bits(f[0]); st_raw(p, r); }]])
    else
      add([[
__device__ __forceinline__ void widen(raw_t r, float (&f)[VEC])
{
#pragma unroll
    for (int i = 0; i < VEC / 2; i++) {
        f[2 * i] = f16_float((ar_u16)(r.w[i] & 0xffffu));
        f[2 * i + 1] = f16_float((ar_u16)(r.w[i] >> 16));
    }
}
__device__ __forceinline__ void store_row(st_t *p, const float (&f)[VEC])
{
    raw_t r;
#pragma unroll
    for (int i = 0; i < VEC / 2; i++)
        r.w[i] = (ar_u32)f16_bits(f[2 * i]) | ((ar_u32)f16_bits(f[2 * i + 1]) << 16);
    st_raw(p, r);
}]])
    end
  end

  -- fp32 vectors of VEC lanes (query, out_gain): loads of at most 16 bytes.
  local fl = {}
  local step = math.min(vec, 4)
  for base = 0, vec - 1, step do
    if step == 1 then
      fl[#fl + 1] = string.format('    asm volatile("ld.global.nc.f32 %%0, [%%1];" : "=f"(f[%d]) : "l"(p + %d));', base, base)
    else
      local regs, outs = {}, {}
      for i = 0, step - 1 do
        regs[#regs + 1] = "%" .. i
        outs[#outs + 1] = string.format('"=f"(f[%d])', base + i)
      end
      fl[#fl + 1] = string.format('    asm volatile("ld.global.nc.v%d.f32 {%s}, [%%%d];" : %s : "l"(p + %d));',
                                  step, table.concat(regs, ", "), step, table.concat(outs, ", "), base)
    end
  end
  add("/* fp32 lanes of the query or the output gain (read-only) */")
  add("__device__ __forceinline__ void ld_f32(const float *p, float (&f)[VEC])\n{\n" ..
      table.concat(fl, "\n") .. "\n}")
  return table.concat(lines, "\n")
end

local ONLINE = [[
constexpr int THREADS = ${THREADS};
constexpr int G = ${G};            /* threads per token */
constexpr int TPB = THREADS / G;   /* tokens per block */
constexpr int WARPS = G / 32;      /* warps per token */
constexpr int C = ${C};            /* vectors per thread per row */
constexpr int B = ${B};            /* sources per batch */
constexpr int STAGE = ${STAGE};    /* 0 reg, 1 pipe, 2 reread */
constexpr bool QREG = ${QREG};     /* query slice kept in registers */

/* Loads this thread's C vectors of B source rows (zeros past N or d).
 * AGAIN: the reread schedule's second read of the same rows. */
template <bool AGAIN>
__device__ __forceinline__ void load_batch(raw_t (&x)[B][C], const attnres_cuda_mix_args &a,
                                           int n0, ar_i64 tok, int k0, int kstep, int nch)
{
#pragma unroll
    for (int b = 0; b < B; b++) {
        const int i = n0 + b;
        const st_t *row = i < a.n ? (const st_t *)a.src[i] + tok * a.src_stride[i] + k0 : nullptr;
#pragma unroll
        for (int c = 0; c < C; c++) {
            if constexpr (AGAIN)
                x[b][c] = row && c < nch ? ld_again(row + c * kstep) : raw_zero();
            else
                x[b][c] = row && c < nch ? ld_nc(row + c * kstep) : raw_zero();
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_mix_args a)
{
    const int tid = threadIdx.x;
    const int gl = TPB == 1 ? tid : (tid & 31);   /* thread within the token */
    const ar_i64 tok = (ar_i64)blockIdx.x * TPB + tid / G;
    if (tok >= a.T)
        return; /* a whole warp (warp map) or the whole block (block map) */
    const int n = a.n;
    const int d = (int)a.d;
    const int heads = a.heads;
    const int hd = d / heads;          /* head width */
    const int hv = hd / VEC;           /* vectors per head */
    const int S = G / heads;           /* threads per head (heads divides G) */
    const int head = gl / S, ts = gl - head * S;
    const int k0 = head * hd + ts * VEC;   /* first element of this thread */
    const int kstep = S * VEC;             /* from one of its vectors to the next */
    const int nch = ts < hv ? (hv - ts + S - 1) / S : 0; /* its vectors, <= C */
    const int lane = tid & 31;
    const float inv_d = __fdividef(1.0f, (float)d);
    const float scale = a.scale, eps = a.eps;
    (void)lane;

    float q[QREG ? C : 1][VEC];
    if (QREG) {
#pragma unroll
        for (int c = 0; c < (QREG ? C : 1); c++) {
            if (c < nch) {
                ld_f32(a.query + k0 + c * kstep, q[c]);
            } else {
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    q[c][v] = 0.0f;
            }
        }
    }

    float acc[C][VEC];
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int v = 0; v < VEC; v++)
            acc[c][v] = 0.0f;
    float m = -1e30f; /* running max: never -inf, so expf(m - m_new) is never NaN */
    float l = 0.0f;   /* running sum of exp(s - m) */

    __shared__ float red[WARPS > 1 ? 2 : 1][B][2][WARPS];
    int par = 0;
    raw_t x[B][C];
    if constexpr (STAGE == 1)
        load_batch<false>(x, a, 0, tok, k0, kstep, nch);

    for (int n0 = 0; n0 < n; n0 += B) {
        if constexpr (STAGE != 1)
            load_batch<false>(x, a, n0, tok, k0, kstep, nch);

        /* This thread's share of each row's sum of squares and its head's dot. */
        float ss[B], dp[B];
#pragma unroll
        for (int b = 0; b < B; b++)
            ss[b] = dp[b] = 0.0f;
#pragma unroll
        for (int c = 0; c < C; c++) {
            if (c < nch) {
                float qv[VEC];
                if (QREG) {
#pragma unroll
                    for (int v = 0; v < VEC; v++)
                        qv[v] = q[QREG ? c : 0][v];
                } else {
                    ld_f32(a.query + k0 + c * kstep, qv);
                }
#pragma unroll
                for (int b = 0; b < B; b++) {
                    float f[VEC];
                    widen(x[b][c], f);
#pragma unroll
                    for (int v = 0; v < VEC; v++) {
                        ss[b] = fmaf(f[v], f[v], ss[b]);
                        dp[b] = fmaf(f[v], qv[v], dp[b]);
                    }
                }
            }
        }

        raw_t xn[B][C];
        if constexpr (STAGE == 1) /* the next batch is in flight while this one reduces */
            load_batch<false>(xn, a, n0 + B, tok, k0, kstep, nch);

        /* Reduce over the token's threads: sums of squares over all of them,
         * dots over the S threads of each head. */
#pragma unroll
        for (int b = 0; b < B; b++) {
            ss[b] = lane_sum(ss[b], 32);
            dp[b] = lane_sum(dp[b], S);
        }
        if constexpr (WARPS > 1) {
            const int w = gl >> 5;
            if (lane == 0) {
#pragma unroll
                for (int b = 0; b < B; b++) {
                    red[par][b][0][w] = ss[b];
                    red[par][b][1][w] = dp[b];
                }
            }
            __syncthreads();
            const int wh = S >> 5; /* warps per head when a head spans warps */
#pragma unroll
            for (int b = 0; b < B; b++) {
                ss[b] = lane_sum(red[par][b][0][lane % WARPS], WARPS);
                if (wh > 0)
                    dp[b] = lane_sum(red[par][b][1][head * wh + (lane & (wh - 1))], wh);
            }
            par ^= 1; /* the next batch uses the other buffer: no second barrier */
        }

        /* Online softmax over the batch, for this thread's head. */
        float s[B], e[B];
        float m_new = m;
#pragma unroll
        for (int b = 0; b < B; b++) {
            const float r = rsqrtf(ss[b] * inv_d + eps);
            s[b] = scale * r * dp[b];
            if (n0 + b < n)
                m_new = fmaxf(m_new, s[b]);
        }
        const float cf = expf(m - m_new);
        float esum = 0.0f;
#pragma unroll
        for (int b = 0; b < B; b++) {
            e[b] = n0 + b < n ? expf(s[b] - m_new) : 0.0f;
            esum += e[b];
        }
        l = l * cf + esum;
        m = m_new;

        if constexpr (STAGE == 2)
            load_batch<true>(x, a, n0, tok, k0, kstep, nch);
#pragma unroll
        for (int c = 0; c < C; c++) {
#pragma unroll
            for (int v = 0; v < VEC; v++)
                acc[c][v] *= cf;
#pragma unroll
            for (int b = 0; b < B; b++) {
                float f[VEC];
                widen(x[b][c], f);
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    acc[c][v] = fmaf(e[b], f[v], acc[c][v]);
            }
        }
        if constexpr (STAGE == 1) {
#pragma unroll
            for (int b = 0; b < B; b++)
#pragma unroll
                for (int c = 0; c < C; c++)
                    x[b][c] = xn[b][c];
        }
    }

    /* out = mix (or partial + alpha * mix); acc keeps the fp32 result. */
    const float inv_l = __fdividef(1.0f, l); /* l is in [1, N] */
    const st_t *prow = a.partial ? (const st_t *)a.partial + tok * a.partial_stride + k0 : nullptr;
    st_t *orow = (st_t *)a.out + tok * a.out_stride + k0;
    float sq = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++) {
        if (c < nch) {
            float o[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++)
                o[v] = acc[c][v] * inv_l;
            if (prow) {
                float pv[VEC];
                widen(ld_g(prow + c * kstep), pv);
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    o[v] = fmaf(a.alpha, o[v], pv[v]);
            }
            store_row(orow + c * kstep, o);
#pragma unroll
            for (int v = 0; v < VEC; v++) {
                acc[c][v] = o[v];
                sq = fmaf(o[v], o[v], sq);
            }
        }
    }

    /* Epilogue: normed = out * rsqrt(mean(out^2) + out_eps) * out_gain. */
    if (a.normed) {
        sq = lane_sum(sq, 32);
        if (WARPS > 1) {
            __shared__ float red_e[WARPS];
            if (lane == 0)
                red_e[gl >> 5] = sq;
            __syncthreads();
            sq = lane_sum(red_e[lane % WARPS], WARPS);
        }
        const float rs = rsqrtf(sq * inv_d + a.out_eps);
        st_t *nrow = (st_t *)a.normed + tok * a.normed_stride + k0;
#pragma unroll
        for (int c = 0; c < C; c++) {
            if (c < nch) {
                float g[VEC], o[VEC];
                ld_f32(a.out_gain + k0 + c * kstep, g);
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    o[v] = acc[c][v] * rs * g[v];
                store_row(nrow + c * kstep, o);
            }
        }
    }
}
]]

local TWOPASS = [[
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int U = ${B};            /* sources loaded together in the sweep */
constexpr int HT = 16;             /* heads per tile of the score table */
constexpr int NMAX = ${MAXS};
#define DOT_UNROLL ${DOT_UNROLL} /* row loops: loads in flight per lane */

__device__ __forceinline__ const st_t *source_row(const attnres_cuda_mix_args &a, int i, ar_i64 tok)
{
    return (const st_t *)a.src[i] + tok * a.src_stride[i];
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_mix_args a)
{
    __shared__ float s_r[NMAX];         /* 1/rms of each source row */
    __shared__ float s_w[NMAX * HT];    /* scores, then softmax weights [source][head] */
    __shared__ float s_q[NMAX * HT];    /* per head sums of squares [source][head] */
    __shared__ float s_red[32];
    const ar_i64 tok = blockIdx.x;
    if (tok >= a.T)
        return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int n = a.n, heads = a.heads;
    const int d = (int)a.d;
    const int hd = d / heads, hv = hd / VEC, dv = d / VEC;
    const float inv_d = __fdividef(1.0f, (float)d);
    const bool fused = heads <= HT; /* one tile covers every head: r from its sums */

    if (!fused) {
        for (int i = warp; i < n; i += WARPS) {
            const st_t *row = source_row(a, i, tok);
            float ss = 0.0f;
#pragma unroll DOT_UNROLL
            for (int j = lane; j < dv; j += 32) {
                float f[VEC];
                widen(ld_nc(row + (ar_i64)j * VEC), f);
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    ss = fmaf(f[v], f[v], ss);
            }
            ss = lane_sum(ss, 32);
            if (lane == 0)
                s_r[i] = rsqrtf(ss * inv_d + a.eps);
        }
    }

    float sq = 0.0f; /* this thread's share of sum(out^2), for the epilogue */
    for (int h0 = 0; h0 < heads; h0 += HT) {
        const int nh = heads - h0 < HT ? heads - h0 : HT;
        /* One warp per (source, head): the head's dot with the query. */
        for (int p = warp; p < n * nh; p += WARPS) {
            const int i = p / nh, hh = p - i * nh;
            const ar_i64 kb = (ar_i64)(h0 + hh) * hd;
            const st_t *row = source_row(a, i, tok) + kb;
            const float *qrow = a.query + kb;
            float dot = 0.0f, ss = 0.0f;
#pragma unroll DOT_UNROLL
            for (int j = lane; j < hv; j += 32) {
                float f[VEC], qv[VEC];
                widen(ld_nc(row + j * VEC), f);
                ld_f32(qrow + j * VEC, qv);
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    dot = fmaf(f[v], qv[v], dot);
                    ss = fmaf(f[v], f[v], ss);
                }
            }
            dot = lane_sum(dot, 32);
            ss = lane_sum(ss, 32);
            if (lane == 0) {
                s_w[i * HT + hh] = dot;
                s_q[i * HT + hh] = ss;
            }
        }
        __syncthreads();
        if (fused) {
            for (int i = tid; i < n; i += THREADS) {
                float ss = 0.0f;
                for (int hh = 0; hh < nh; hh++)
                    ss += s_q[i * HT + hh];
                s_r[i] = rsqrtf(ss * inv_d + a.eps);
            }
            __syncthreads();
        }
        /* Depth softmax, one per head. */
        for (int hh = tid; hh < nh; hh += THREADS) {
            float m = -1e30f; /* never -inf */
            for (int i = 0; i < n; i++) {
                const float s = a.scale * s_r[i] * s_w[i * HT + hh];
                s_w[i * HT + hh] = s;
                m = fmaxf(m, s);
            }
            float l = 0.0f;
            for (int i = 0; i < n; i++) {
                const float e = expf(s_w[i * HT + hh] - m);
                s_w[i * HT + hh] = e;
                l += e;
            }
            const float inv = __fdividef(1.0f, l); /* l is in [1, N] */
            for (int i = 0; i < n; i++)
                s_w[i * HT + hh] *= inv;
        }
        __syncthreads();
        /* The sweep: every element of the tile's heads, all sources. */
        const ar_i64 kbase = (ar_i64)h0 * hd;
        const st_t *prow = a.partial ? (const st_t *)a.partial + tok * a.partial_stride + kbase : nullptr;
        st_t *orow = (st_t *)a.out + tok * a.out_stride + kbase;
        for (int j = tid; j < nh * hv; j += THREADS) {
            const int hh = j / hv;
            const int k = j * VEC;
            float o[VEC];
#pragma unroll
            for (int v = 0; v < VEC; v++)
                o[v] = 0.0f;
            for (int i0 = 0; i0 < n; i0 += U) {
                raw_t x[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    x[u] = i0 + u < n ? ld_nc(source_row(a, i0 + u, tok) + kbase + k) : raw_zero();
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (i0 + u < n) {
                        const float w = s_w[(i0 + u) * HT + hh];
                        float f[VEC];
                        widen(x[u], f);
#pragma unroll
                        for (int v = 0; v < VEC; v++)
                            o[v] = fmaf(w, f[v], o[v]);
                    }
                }
            }
            if (prow) {
                float pv[VEC];
                widen(ld_g(prow + k), pv);
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    o[v] = fmaf(a.alpha, o[v], pv[v]);
            }
            store_row(orow + k, o);
#pragma unroll
            for (int v = 0; v < VEC; v++)
                sq = fmaf(o[v], o[v], sq);
        }
        __syncthreads(); /* before the next tile reuses the tables */
    }

    /* Epilogue: normed = out * rsqrt(mean(out^2) + out_eps) * out_gain,
     * reading back the rows this block has just written. */
    if (a.normed) {
        sq = lane_sum(sq, 32);
        if (lane == 0)
            s_red[warp] = sq;
        __syncthreads();
        sq = lane_sum(s_red[lane % WARPS], WARPS);
        const float rs = rsqrtf(sq * inv_d + a.out_eps);
        const st_t *orow = (const st_t *)a.out + tok * a.out_stride;
        st_t *nrow = (st_t *)a.normed + tok * a.normed_stride;
        for (int j = tid; j < dv; j += THREADS) {
            float o[VEC], g[VEC];
            widen(ld_back(orow + (ar_i64)j * VEC), o);
            ld_f32(a.out_gain + (ar_i64)j * VEC, g);
#pragma unroll
            for (int v = 0; v < VEC; v++)
                o[v] = o[v] * rs * g[v];
            store_row(nrow + (ar_i64)j * VEC, o);
        }
    }
}
]]

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local vars = {
    ABI = ABI, ARGS = kabi.struct("cuda_mix"), MAXS = MAX_SOURCES, NAME = name, THREADS = p.threads, B = p.batch,
  }
  local body
  if p.sched == "twopass" then
    vars.DOT_UNROLL = p.vec >= 4 and 2 or 4
    body = gen.subst(TWOPASS, vars)
  else
    vars.G = group_threads(p)
    vars.C = p.chunks
    vars.STAGE = ({ reg = 0, pipe = 1, reread = 2 })[p.sched]
    vars.QREG = query_in_registers(p) and "true" or "false"
    body = gen.subst(ONLINE, vars)
  end
  local src = gen.subst(PRELUDE, vars) .. "\n/* ---- storage helpers ---- */\n" ..
    storage_code(p.dtype, p.vec) .. "\n/* ---- kernel ---- */\n" .. body
  return src, name
end

return T
