-- lib/cuda_mix.lua: what the two CUDA mix templates share
-- (cuda/mix_online.lua, cuda/mix_twopass.lua): the kernel argument struct,
-- the launch data both report, the source's frame and the numerics below;
-- and the per-token depth statistics (1/rms of each row, the depth softmax
-- per head) that cuda/mix_twopass.lua and cuda/mix_backward.lua compute
-- alike.
--
-- One kernel entry per variant:
--   extern "C" __global__ void attnres_<id>(const attnres_cuda_mix_args a)
-- The argument struct is passed by value (no device allocation per launch,
-- so launches can be captured in CUDA graphs); its one definition is
-- templates/lib/kernel_abi.lua (cuda_mix), which the runtime's
-- kernel_abi.h is generated from too. The source needs no headers.
--
-- Numerics: fp32 everywhere after loading; the running max starts at -1e30f
-- (never -inf); token offsets are 64-bit; a NaN in one token's source row
-- reaches only that token's output. 1/rms uses rsqrtf and 1/l __fdividef
-- (both within 2 ulp): the IEEE forms call a slow-path subroutine that
-- makes ptxas report spills.

local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")
local kabi = require("lib/kernel_abi")

local M = {}

M.ABI = kabi.version("cuda_mix")
M.MAX_SOURCES = kabi.const.AR_CUDA_MAX_SOURCES
M.esize = storage.esize

-- The tuner's seeds (the variants a template proposes as starting points,
-- which must compile without spills on every supported architecture) of
-- the kernels that sweep U sources at a time (cuda/mix_twopass.lua,
-- cuda/mix_backward.lua): 256 threads, 16-byte loads, four sources in
-- flight.
function M.sweep_seed(p)
  return p.threads == 256 and p.vec * M.esize[p.dtype] == 16 and p.unroll == 4
end

-- The launch data of a variant: its block size, tokens per block and dmax
-- (0: any d) come from the template, the rest follows from dtype and vec.
function M.launch(p, block, tokens_per_block, dmax, default)
  return {
    abi = M.ABI,
    abi_op = kabi.op("cuda_mix"),
    block = block,
    tokens_per_block = tokens_per_block,
    smem = 0, -- dynamic shared memory; the static part is in the binary
    align = p.vec * M.esize[p.dtype], -- bytes: source/partial/out/normed pointers and strides*size
    qalign = math.min(p.vec * 4, 16), -- bytes: query and out_gain pointers
    max_sources = M.MAX_SOURCES,
    dmax = dmax,
    default = default and 1 or 0,
  }
end

-- The checks every mix variant makes before its schedule's own.
function M.applies(T, p, problem, device)
  return space.applies(T, p, problem, device, { max_sources = M.MAX_SOURCES })
end

-- The depth statistics of one token, as device functions a kernel's text
-- places with ${DEPTH_STATS}; they need nothing but the CUDA math
-- intrinsics, so kernels of any argument struct can use them.
M.DEPTH_STATS = [[
/* 1/rms of each of the n source rows from the sums of squares of its heads,
 * ss[i * stride + h] for h < heads, added in head order. Thread tid of
 * threads takes rows tid, tid + threads, ... */
__device__ __forceinline__ void depth_rms(float *r, const float *ss, int stride, int heads, int n, float inv_d,
                                          float eps, int tid, int threads)
{
    for (int i = tid; i < n; i += threads) {
        float s = 0.0f;
        for (int h = 0; h < heads; h++)
            s += ss[i * stride + h];
        r[i] = rsqrtf(s * inv_d + eps);
    }
}

/* The depth softmax of head h: dot[i * step + h] is the dot of source i's
 * head slice with the query, r[i] the row's 1/rms, and w[i * step + h]
 * gets the weight of source i (w may be dot: the softmax then runs in
 * place). With MEAN it returns sum_i w_i g[i * step + h], the weights'
 * mean of g (the backward's delta), taken in the pass that normalizes the
 * weights; without, 0 (g is not read). */
template <bool MEAN>
__device__ __forceinline__ float depth_softmax(float *w, const float *dot, const float *g, int step, int h,
                                               const float *r, int n, float scale)
{
    float m = -1e30f; /* never -inf */
    for (int i = 0; i < n; i++) {
        const float s = scale * r[i] * dot[i * step + h];
        w[i * step + h] = s;
        m = fmaxf(m, s);
    }
    float l = 0.0f;
    for (int i = 0; i < n; i++) {
        const float e = expf(w[i * step + h] - m);
        w[i * step + h] = e;
        l += e;
    }
    const float inv = __fdividef(1.0f, l); /* l is in [1, N] */
    float mean = 0.0f;
    for (int i = 0; i < n; i++) {
        const float wi = w[i * step + h] * inv;
        w[i * step + h] = wi;
        if (MEAN)
            mean = fmaf(wi, g[i * step + h], mean);
    }
    return mean;
}]]

-- The source of a variant: storage helpers, the argument struct (from
-- lib/kernel_abi.lua), then the schedule's kernel text with vars
-- substituted (ABI, MAXS, NAME and DEPTH_STATS added).
function M.source(p, name, kernel, vars)
  vars.ABI = M.ABI
  vars.MAXS = M.MAX_SOURCES
  vars.NAME = name
  vars.DEPTH_STATS = M.DEPTH_STATS
  return "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" .. kabi.struct("cuda_mix") .. "\n" .. gen.subst(kernel, vars)
end

return M
