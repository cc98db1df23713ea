-- cuda/mix_twopass.lua: the AttnRes depth mix (DESIGN §1) as CUDA C++ for
-- NVRTC, in two passes over the sources. The argument struct, the launch
-- data and the numerics are lib/cuda_mix.lua's; the other schedule family
-- is cuda/mix_online.lua.
--
-- One block per token, any d and any number of heads: scores first (one
-- warp per source x head), the depth softmax in shared memory, then one
-- sweep over the N rows side by side, `unroll` sources at a time. Rows are
-- read twice (the second time mostly from L2). The runtime's generic
-- (fallback) kernel is a variant of this template.

local template = require("lib/template")
local mix = require("lib/cuda_mix")

local T = template.new("cuda", "mix", {
  -- threads per block
  { name = "threads", values = { 256, 512 } },
  -- elements per load: 1 (scalar loads, any alignment), or a 16-byte load
  -- (an 8-byte one too, with 256 threads and unroll 4)
  { name = "vec", values = { 1, 2, 4, 8 } },
  -- sources whose loads the sweep issues together
  { name = "unroll", values = { 2, 4 } },
}, {
  -- The runtime's built-in fallback: scalar loads (any alignment, any head
  -- width), any d, any H, N <= 64.
  generic = { threads = 256, vec = 1, unroll = 4 },
})

local esize = mix.esize

function T.constraint(p)
  local vb = p.vec * esize[p.dtype]
  if vb > 16 then return false end
  return p.vec == 1 or vb == 16 or (vb == 8 and p.threads == 256 and p.unroll == 4)
end

function T.id(p)
  return string.format("mix_cu_%s_twopass_b%d_v%d_u%d", p.dtype, p.threads, p.vec, p.unroll)
end

function T.launch(p)
  return mix.launch(p, p.threads, 1, 0, mix.sweep_seed(p))
end

function T.applies(p, problem, device)
  return mix.applies(T, p, problem, device)
end

-- ---- emitted code -------------------------------------------------------

local TWOPASS = [[
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int U = ${U};            /* sources loaded together in the sweep */
constexpr int HT = 16;             /* heads per tile of the score table */
constexpr int NMAX = ${MAXS};
#define DOT_UNROLL ${DOT_UNROLL} /* row loops: loads in flight per lane */

__device__ __forceinline__ const st_t *source_row(const attnres_cuda_mix_args &a, int i, ar_i64 tok)
{
    return (const st_t *)a.src[i] + tok * a.src_stride[i];
}

${DEPTH_STATS}

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
                widen(ld_ro(row + (ar_i64)j * VEC), f);
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
                widen(ld_ro(row + j * VEC), f);
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
            depth_rms(s_r, s_q, HT, nh, n, inv_d, a.eps, tid, THREADS);
            __syncthreads();
        }
        /* Depth softmax, one per head, in place. */
        for (int hh = tid; hh < nh; hh += THREADS)
            depth_softmax<false>(s_w, s_w, nullptr, HT, hh, s_r, n, a.scale);
        __syncthreads();
        /* The sweep: every element of the tile's heads, all sources. */
        const ar_i64 kbase = (ar_i64)h0 * hd;
        const st_t *prow = a.partial ? (const st_t *)a.partial + tok * a.partial_stride + kbase : nullptr;
        st_t *orow = (st_t *)a.out + tok * a.out_stride + kbase;
        for (int j = tid; j < nh * hv; j += THREADS) {
            const int hh = j / hv;
            const int k = j * VEC;
            float o[VEC] = {0.0f};
            for (int i0 = 0; i0 < n; i0 += U) {
                raw_t x[U];
#pragma unroll
                for (int u = 0; u < U; u++)
                    x[u] = i0 + u < n ? ld_ro(source_row(a, i0 + u, tok) + kbase + k) : raw_zero();
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
                widen(ld_rw(prow + k), pv);
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
            widen(ld_rw(orow + (ar_i64)j * VEC), o);
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
  return mix.source(p, name, TWOPASS, {
    THREADS = p.threads,
    U = p.unroll,
    DOT_UNROLL = p.vec >= 4 and 2 or 4,
  }), name
end

return T
