-- cuda/phase1.lua: phase 1 of Block AttnRes (DESIGN §1, two-phase form) as
-- CUDA C++ for NVRTC: the S pseudo-queries of one block against its n
-- completed block representations, batched. Same math as cpu/phase1.lua.
--
-- One kernel entry per variant:
--   extern "C" __global__ void attnres_<id>(const attnres_cuda_phase1_args a)
-- The struct is passed by value; it is defined, and versioned, in
-- templates/lib/kernel_abi.lua (cuda_phase1). One block per token. The launch gives
-- (n*S*H + n*H + n) * 4 bytes of dynamic shared memory: the score table
-- w[i][j][h], the per-head sums of squares of each row, and each row's r.
--
--   scores  one warp per (source i, head h, block of `sj` sites): the head
--           slice of row i is read once per site block and dotted with
--           `sj` queries at a time; the row's per-head sum of squares comes
--           with it, and r_i (over the full row) is their sum.
--   softmax one thread per (site, head): m, l, the probabilities in place,
--           and lse = m + log(l).
--   sweep   each thread owns vectors of `vec` elements; for each block of
--           `sj` sites it folds the n rows into `sj` fp32 sums and stores
--           them to o1 (rows are re-read from L1/L2 once per site block).
--
-- Parameters: threads per block; vec = 1 (scalar loads, any alignment) or a
-- 16-byte load; sj = sites per sweep (registers vs re-reads).
-- Numerics: fp32 throughout, running max from -1e30f, 64-bit token offsets,
-- rsqrtf for 1/rms; NaN in one token's rows reaches only that token.

local template = require("lib/template")
local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")

local T = template.new("cuda", "phase1", {
  { name = "threads", values = { 128, 256, 512 } },
  -- elements per load: 1, or a 16-byte load (4 f32, 8 bf16/f16)
  { name = "vec", values = { 1, 4, 8 } },
  -- sites per score sweep and per mixing sweep
  { name = "sj", values = { 2, 4 } },
}, {
  generic = { threads = 256, vec = 1, sj = 4 },
})

local kabi = require("lib/kernel_abi")
local ABI = kabi.version("cuda_phase1")
local MAX_SOURCES = kabi.const.AR_CUDA_PHASE1_MAX_SOURCES
local MAX_SITES = kabi.const.AR_CUDA_PHASE1_MAX_SITES
-- Dynamic shared memory a launch may use without an opt-in: 48 KiB.
local MAX_SMEM_FLOATS = 12288

local function smem_floats(n, s, h)
  return n * s * h + n * h + n
end

T.constraint = space.scalar_or_16_bytes

function T.id(p)
  return string.format("phase1_cu_%s_b%d_v%d_s%d", p.dtype, p.threads, p.vec, p.sj)
end

-- The runtime adds (n*S*H + n*H + n) * 4 bytes of shared memory per launch.
function T.launch(p)
  return space.phase_launch(p, "cuda_phase1", {
    max_sources = MAX_SOURCES,
    max_sites = MAX_SITES,
    default = (p.threads == 256 and p.vec > 1 and p.sj == 4) and 1 or 0,
  })
end

function T.applies(p, problem, device)
  local ok, why = space.applies(T, p, problem, device,
                                { max_sources = MAX_SOURCES, max_sites = MAX_SITES })
  if not ok then return false, why end
  local H, n, s = problem.heads, problem.n, problem.s
  local f = smem_floats(n, s, H)
  if f > MAX_SMEM_FLOATS then
    return false, string.format("n*S*H + n*H + n = %d floats exceed the %d of 48 KiB shared memory",
                                f, MAX_SMEM_FLOATS)
  end
  return true
end

local KERNEL = [[
${ARGS}
constexpr int THREADS = ${THREADS};
constexpr int WARPS = THREADS / 32;
constexpr int SJ = ${SJ};

extern "C" __global__ void __launch_bounds__(THREADS, 1) ${NAME}(const attnres_cuda_phase1_args a)
{
    extern __shared__ float sm[];
    const ar_i64 tok = blockIdx.x;
    if (tok >= a.T)
        return;
    const int n = a.n, heads = a.heads, sites = a.s;
    float *s_w = sm;                                  /* [n][sites][heads] */
    float *s_ss = s_w + n * sites * heads;            /* [n][heads] */
    float *s_r = s_ss + n * heads;                    /* [n] */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int d = (int)a.d, hd = d / heads, hv = hd / VEC, dv = d / VEC;
    const float inv_d = __fdividef(1.0f, (float)d);
    const int nsb = (sites + SJ - 1) / SJ;

    /* Scores: one warp per (row, head, block of SJ sites). */
    for (int p = warp; p < n * heads * nsb; p += WARPS) {
        const int jb = p % nsb, ih = p / nsb;
        const int i = ih / heads, h = ih - i * heads, j0 = jb * SJ;
        const st_t *row = (const st_t *)a.src[i] + tok * a.src_stride[i] + (ar_i64)h * hd;
        const float *q = a.queries + (ar_i64)j0 * d + (ar_i64)h * hd;
        float ss = 0.0f, dot[SJ] = {0.0f};
        for (int v = lane; v < hv; v += 32) {
            float x[VEC];
            widen(ld_ro(row + v * VEC), x);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                ss = fmaf(x[e], x[e], ss);
#pragma unroll
            for (int jj = 0; jj < SJ; jj++) {
                if (j0 + jj < sites) {
                    float qv[VEC];
                    ld_f32(q + (ar_i64)jj * d + v * VEC, qv);
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        dot[jj] = fmaf(x[e], qv[e], dot[jj]);
                }
            }
        }
        ss = warp_sum(ss);
#pragma unroll
        for (int jj = 0; jj < SJ; jj++)
            dot[jj] = warp_sum(dot[jj]);
        if (lane == 0) {
            if (jb == 0)
                s_ss[i * heads + h] = ss;
#pragma unroll
            for (int jj = 0; jj < SJ; jj++)
                if (j0 + jj < sites)
                    s_w[(i * sites + j0 + jj) * heads + h] = dot[jj];
        }
    }
    __syncthreads();
    /* r_i over the full row: the sum of its heads' sums of squares. */
    for (int i = tid; i < n; i += THREADS) {
        float ss = 0.0f;
        for (int h = 0; h < heads; h++)
            ss += s_ss[i * heads + h];
        s_r[i] = rsqrtf(ss * inv_d + a.eps);
    }
    __syncthreads();
    /* One depth softmax per (site, head); lse = m + log(l). */
    for (int p = tid; p < sites * heads; p += THREADS) {
        const int j = p / heads, h = p - j * heads;
        float *w = s_w + j * heads + h;
        const int step = sites * heads;
        float m = -1e30f; /* never -inf */
        for (int i = 0; i < n; i++) {
            const float s = a.scale * s_r[i] * w[i * step];
            w[i * step] = s;
            m = fmaxf(m, s);
        }
        float l = 0.0f;
        for (int i = 0; i < n; i++) {
            const float e = expf(w[i * step] - m);
            w[i * step] = e;
            l += e;
        }
        const float inv = __fdividef(1.0f, l); /* l is in [1, n] */
        for (int i = 0; i < n; i++)
            w[i * step] *= inv;
        a.lse[j][tok * a.lse_stride + h] = m + logf(l);
    }
    __syncthreads();
    /* The sweep: o1_j = sum_i w[i][j][head] * v_i, SJ sites at a time. */
    for (int j0 = 0; j0 < sites; j0 += SJ) {
        for (int v = tid; v < dv; v += THREADS) {
            const int k = v * VEC, h = k / hd;
            float acc[SJ][VEC] = {{0.0f}};
#pragma unroll 2
            for (int i = 0; i < n; i++) {
                float x[VEC];
                widen(ld_ro((const st_t *)a.src[i] + tok * a.src_stride[i] + k), x);
                const float *wi = s_w + (i * sites + j0) * heads + h;
#pragma unroll
                for (int jj = 0; jj < SJ; jj++) {
                    const float w = j0 + jj < sites ? wi[jj * heads] : 0.0f;
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        acc[jj][e] = fmaf(w, x[e], acc[jj][e]);
                }
            }
#pragma unroll
            for (int jj = 0; jj < SJ; jj++)
                if (j0 + jj < sites)
                    st_raw((st_t *)a.o1[j0 + jj] + tok * a.o1_stride + k, narrow(acc[jj]));
        }
    }
}
]]

function T.emit(p)
  local name = "attnres_" .. T.id(p)
  local src = "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" ..
    gen.subst(KERNEL, { ABI = ABI, ARGS = kabi.struct("cuda_phase1"), MAXN = MAX_SOURCES, MAXS = MAX_SITES, NAME = name,
                        THREADS = p.threads, SJ = p.sj })
  return src, name
end

return T
