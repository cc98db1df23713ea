-- cuda/mix_online.lua: the AttnRes depth mix (DESIGN §1) as CUDA C++ for
-- NVRTC, with an online softmax over the sources. The argument struct, the
-- launch data and the numerics are lib/cuda_mix.lua's; the other schedule
-- family is cuda/mix_twopass.lua.
--
-- Schedules (parameter `sched`):
--   reg      each thread keeps its slice of the fp32 accumulator row and of
--            the `batch` source rows it is working on in registers, so
--            every source element is read from memory exactly once.
--   pipe     as reg, and the next batch's loads are issued before the
--            current batch's reductions (register double buffering).
--   reread   as reg, but source rows are not kept across the reduction: the
--            accumulate step reads them again (from L1/L2), trading traffic
--            for registers and occupancy.
--
-- Mapping: `map` = "warp" gives one warp per token (threads/32 tokens per
-- block, no barriers); "block" gives the whole block to one token. Within a
-- token the G threads are split into H groups of S = G/H, one per head, so
-- each thread's dot product belongs to one head. A thread owns `chunks`
-- vectors of `vec` elements, strided by S*vec: loads are coalesced, the
-- slice is a compile-time size (registers), and d is a run-time value up to
-- dmax = chunks*G*vec (in the variant id as d<dmax>).

local template = require("lib/template")
local mix = require("lib/cuda_mix")

local T = template.new("cuda", "mix", {
  { name = "sched", values = { "reg", "pipe", "reread" } },
  { name = "map", values = { "warp", "block" } },
  -- threads per block
  { name = "threads", values = { 128, 256, 512, 1024 } },
  -- elements per load: always a 16-byte load (the constraint)
  { name = "vec", values = { 1, 2, 4, 8 } },
  -- vectors per thread per row, so d <= dmax = chunks*G*vec is a
  -- compile-time bound (d itself stays a run-time value)
  { name = "chunks", values = { 1, 2, 4, 8 } },
  -- sources reduced per batch
  { name = "batch", values = { 1, 2, 4 } },
})

local esize = mix.esize

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
  if p.vec * esize[p.dtype] ~= 16 then return false end
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
  local dm = dmax(p)
  if p.sched == "reg" and p.batch == 2 then
    if p.map == "block" and p.threads == 256 and (dm == 4096 or dm == 8192) then return true end
    if p.map == "warp" and dm == 1024 then return true end
  end
  return p.sched == "pipe" and p.map == "block" and p.threads == 512 and dm == 8192 and p.batch == 1
end

function T.launch(p)
  return mix.launch(p, p.threads, p.map == "warp" and p.threads // 32 or 1, dmax(p), is_default(p))
end

function T.applies(p, problem, device)
  local ok, why = mix.applies(T, p, problem, device)
  if not ok then return false, why end
  local d, H = problem.d, problem.heads
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

local ONLINE = [[
constexpr int THREADS = ${THREADS};
constexpr int G = ${G};            /* threads per token */
constexpr int TPB = THREADS / G;   /* tokens per block */
constexpr int WARPS = G / 32;      /* warps per token */
constexpr int C = ${C};            /* vectors per thread per row */
constexpr int B = ${B};            /* sources per batch */
constexpr int STAGE = ${STAGE};    /* 0 reg, 1 pipe, 2 reread */
constexpr bool QREG = ${QREG};     /* query slice kept in registers */

/* Loads this thread's C vectors of B source rows (zeros past N or d). The
 * reread schedule calls it twice for the same rows: ld_ro is volatile, so
 * the second call reads memory again instead of keeping the first's
 * registers alive. */
__device__ __forceinline__ void load_batch(raw_t (&x)[B][C], const attnres_cuda_mix_args &a,
                                           int n0, ar_i64 tok, int k0, int kstep, int nch)
{
#pragma unroll
    for (int b = 0; b < B; b++) {
        const int i = n0 + b;
        const st_t *row = i < a.n ? (const st_t *)a.src[i] + tok * a.src_stride[i] + k0 : nullptr;
#pragma unroll
        for (int c = 0; c < C; c++) {
            x[b][c] = row && c < nch ? ld_ro(row + c * kstep) : raw_zero();
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

    float acc[C][VEC] = {{0.0f}};
    float m = -1e30f; /* running max: never -inf, so expf(m - m_new) is never NaN */
    float l = 0.0f;   /* running sum of exp(s - m) */

    __shared__ float red[WARPS > 1 ? 2 : 1][B][2][WARPS];
    int par = 0;
    raw_t x[B][C];
    if constexpr (STAGE == 1)
        load_batch(x, a, 0, tok, k0, kstep, nch);

    for (int n0 = 0; n0 < n; n0 += B) {
        if constexpr (STAGE != 1)
            load_batch(x, a, n0, tok, k0, kstep, nch);

        /* This thread's share of each row's sum of squares and its head's dot. */
        float ss[B] = {0.0f}, dp[B] = {0.0f};
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
            load_batch(xn, a, n0 + B, tok, k0, kstep, nch);

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
            load_batch(x, a, n0, tok, k0, kstep, nch);
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
                widen(ld_rw(prow + c * kstep), pv);
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

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  return mix.source(p, name, ONLINE, {
    THREADS = p.threads,
    G = group_threads(p),
    C = p.chunks,
    B = p.batch,
    STAGE = ({ reg = 0, pipe = 1, reread = 2 })[p.sched],
    QREG = query_in_registers(p) and "true" or "false",
  }), name
end

return T
