-- cuda/phase2.lua: phase 2 of Block AttnRes (DESIGN §1, two-phase form) as
-- CUDA C++ for NVRTC: one routing site merges its phase-1 result (o1, lse)
-- with the block's running partial sum b. Same math as cpu/phase2.lua.
--
-- One kernel entry per variant:
--   extern "C" __global__ void attnres_<id>(const attnres_cuda_phase2_args a)
-- The struct is passed by value; it is defined, and versioned, in
-- templates/lib/kernel_abi.lua (cuda_phase2). One block per token; each head gets
-- max(1, warps/H) warps (heads beyond the warps are taken in turns), and a
-- thread keeps the same elements in every pass:
--   A  (b += f, stored rounded, when the add is fused) the head's dot of b
--      with the query and its sum of squares;
--   -  r_b over the full row, p2_h = sigmoid(scale * r_b * dot_h - lse_h);
--   B  out = o1 + p2 * (b - o1), and sum(out^2) for the epilogue;
--   C  (epilogue) normed = out * rsqrt(mean(out^2) + out_eps) * out_gain,
--      with out recomputed in fp32 (as the CPU kernel keeps it).
--
-- Parameters: threads per block; vec = 1 (scalar loads) or a 16-byte load.
-- Numerics: fp32 throughout, 64-bit token offsets, rsqrtf for 1/rms; with
-- the fused add the scores use b as stored; NaN stays in its token.

local template = require("lib/template")
local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")

local T = template.new("cuda", "phase2", {
  { name = "threads", values = { 128, 256, 512 } },
  -- elements per load: 1, or a 16-byte load (4 f32, 8 bf16/f16)
  { name = "vec", values = { 1, 4, 8 } },
}, {
  generic = { threads = 256, vec = 1 },
})

local kabi = require("lib/kernel_abi")
local ABI = kabi.version("cuda_phase2")
local MAX_HEADS = 1024

T.constraint = space.scalar_or_16_bytes

function T.id(p)
  return string.format("phase2_cu_%s_b%d_v%d", p.dtype, p.threads, p.vec)
end

function T.launch(p)
  return space.phase_launch(p, "cuda_phase2", {
    max_heads = MAX_HEADS,
    default = (p.threads == 256 and p.vec > 1) and 1 or 0,
  })
end

function T.applies(p, problem, device)
  return space.applies(T, p, problem, device, { max_heads = MAX_HEADS })
end

local KERNEL = [[
${ARGS}
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int MAXH = ${MAXH};

/* The logistic function; exp never overflows, and NaN stays NaN. */
__device__ __forceinline__ float sigmoid(float x)
{
    if (x >= 0.0f)
        return __fdividef(1.0f, 1.0f + expf(-x));
    const float e = expf(x);
    return __fdividef(e, 1.0f + e);
}

__device__ __forceinline__ void merge(const float (&o)[VEC], const float (&b)[VEC], float p2, float (&y)[VEC])
{
#pragma unroll
    for (int e = 0; e < VEC; e++)
        y[e] = o[e] + p2 * (b[e] - o[e]);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_phase2_args a)
{
    __shared__ float s_ss[MAXH]; /* per-part sums of squares, then p2 per head */
    __shared__ float s_dot[MAXH];
    __shared__ float s_red[32];
    const ar_i64 tok = blockIdx.x;
    if (tok >= a.T)
        return;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int heads = a.heads;
    const int d = (int)a.d, hd = d / heads, hv = hd / VEC;
    const float inv_d = __fdividef(1.0f, (float)d);
    /* wph warps per head; G groups of them take the heads in turns. */
    const int wph = heads < WARPS ? WARPS / heads : 1;
    const int G = WARPS / wph, g = warp / wph, sub = warp - g * wph;
    const int h0 = g < G ? g : heads; /* a leftover warp has no head */
    const int vstep = wph * 32, v0 = sub * 32 + lane;

    st_t *brow = (st_t *)a.partial + tok * a.partial_stride;
    const st_t *frow = a.sublayer ? (const st_t *)a.sublayer + tok * a.sublayer_stride : nullptr;
    const st_t *orow = (const st_t *)a.o1 + tok * a.o1_stride;

    /* A: the fused add, and per head the dot with the query and sum(b^2). */
    for (int h = h0; h < heads; h += G) {
        float ss = 0.0f, dot = 0.0f;
        for (int v = v0; v < hv; v += vstep) {
            const ar_i64 k = (ar_i64)h * hd + v * VEC;
            float x[VEC], q[VEC];
            if (frow) {
                float f[VEC];
                widen(ld_rw(brow + k), x);
                widen(ld_ro(frow + k), f);
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    x[e] += f[e];
                const raw_t r = narrow(x);
                st_raw(brow + k, r);
                widen(r, x); /* b as stored */
            } else {
                widen(ld_rw(brow + k), x);
            }
            ld_f32(a.query + k, q);
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                ss = fmaf(x[e], x[e], ss);
                dot = fmaf(x[e], q[e], dot);
            }
        }
        ss = warp_sum(ss);
        dot = warp_sum(dot);
        if (lane == 0) {
            s_ss[h * wph + sub] = ss;
            s_dot[h * wph + sub] = dot;
        }
    }
    __syncthreads();
    if (warp == 0) {
        float ss = 0.0f;
        for (int p = lane; p < heads * wph; p += 32)
            ss += s_ss[p];
        ss = warp_sum(ss);
        if (lane == 0)
            s_red[0] = rsqrtf(ss * inv_d + a.eps);
    }
    __syncthreads();
    {
        const float r = s_red[0];
        const float *lse = a.lse + tok * a.lse_stride;
        for (int h = tid; h < heads; h += THREADS) {
            float dot = 0.0f;
            for (int s = 0; s < wph; s++)
                dot += s_dot[h * wph + s];
            s_dot[h * wph] = sigmoid(a.scale * r * dot - lse[h]); /* p2 */
        }
    }
    __syncthreads();

    /* B: out = o1 + p2 * (b - o1). */
    st_t *outrow = (st_t *)a.out + tok * a.out_stride;
    float sq = 0.0f;
    for (int h = h0; h < heads; h += G) {
        const float p2 = s_dot[h * wph];
        for (int v = v0; v < hv; v += vstep) {
            const ar_i64 k = (ar_i64)h * hd + v * VEC;
            float o[VEC], b[VEC], y[VEC];
            widen(ld_ro(orow + k), o);
            widen(ld_rw(brow + k), b);
            merge(o, b, p2, y);
            st_raw(outrow + k, narrow(y));
#pragma unroll
            for (int e = 0; e < VEC; e++)
                sq = fmaf(y[e], y[e], sq);
        }
    }

    /* C: the epilogue, from out recomputed in fp32. */
    if (a.normed) {
        sq = warp_sum(sq);
        __syncthreads(); /* s_red[0] has been read by everyone */
        if (lane == 0)
            s_red[warp] = sq;
        __syncthreads();
        sq = warp_sum(lane < WARPS ? s_red[lane] : 0.0f);
        const float rs = rsqrtf(sq * inv_d + a.out_eps);
        st_t *nrow = (st_t *)a.normed + tok * a.normed_stride;
        for (int h = h0; h < heads; h += G) {
            const float p2 = s_dot[h * wph];
            for (int v = v0; v < hv; v += vstep) {
                const ar_i64 k = (ar_i64)h * hd + v * VEC;
                float o[VEC], b[VEC], y[VEC], gv[VEC];
                widen(ld_ro(orow + k), o);
                widen(ld_rw(brow + k), b);
                merge(o, b, p2, y);
                ld_f32(a.out_gain + k, gv);
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    y[e] = y[e] * rs * gv[e];
                st_raw(nrow + k, narrow(y));
            }
        }
    }
}
]]

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local src = "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" ..
    gen.subst(KERNEL, { ABI = ABI, ARGS = kabi.struct("cuda_phase2"), MAXH = MAX_HEADS, NAME = name, THREADS = p.threads })
  return src, name
end

return T
