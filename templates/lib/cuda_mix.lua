-- lib/cuda_mix.lua: what the two CUDA mix templates share
-- (cuda/mix_online.lua, cuda/mix_twopass.lua): the kernel argument struct,
-- the launch data both report, the source's frame and the numerics below.
--
-- One kernel entry per variant:
--   extern "C" __global__ void attnres_<id>(const attnres_cuda_mix_args a)
-- The argument struct is passed by value (no device allocation per launch,
-- so launches can be captured in CUDA graphs); it must match
-- runtime/src/cuda_kernel_abi.h (ABI 1). The source needs no headers.
--
-- Numerics: fp32 everywhere after loading; the running max starts at -1e30f
-- (never -inf); token offsets are 64-bit; a NaN in one token's source row
-- reaches only that token's output. 1/rms uses rsqrtf and 1/l __fdividef
-- (both within 2 ulp): the IEEE forms call a slow-path subroutine that
-- makes ptxas report spills.

local storage = require("lib/cuda_storage")
local space = require("lib/cuda_space")

local M = {}

M.ABI = 1
M.MAX_SOURCES = 64
M.esize = storage.esize

-- The argument struct, after the storage helpers (which define ar_i64).
local PRELUDE = [[
/* Kernel arguments, ABI ${ABI}: must match runtime/src/cuda_kernel_abi.h.
 * Passed by value. Strides count elements. */
struct attnres_cuda_mix_args {
    const void *src[${MAXS}];
    ar_i64 src_stride[${MAXS}];
    ar_i64 d;
    int n, heads;
    ar_i64 T;
    const float *query;
    float scale, eps;
    const void *partial;
    ar_i64 partial_stride;
    float alpha;
    void *out;
    ar_i64 out_stride;
    const float *out_gain;
    float out_eps;
    void *normed;
    ar_i64 normed_stride;
};
static_assert(sizeof(attnres_cuda_mix_args) == 1136, "attnres_cuda_mix_args differs from the runtime's");

]]

-- The launch data of a variant: its block size, tokens per block and dmax
-- (0: any d) come from the template, the rest follows from dtype and vec.
function M.launch(p, block, tokens_per_block, dmax, default)
  return {
    abi = M.ABI,
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

-- The source of a variant: storage helpers, the argument struct, then the
-- schedule's kernel text with vars substituted (ABI, MAXS and NAME added).
function M.source(p, name, kernel, vars)
  vars.ABI = M.ABI
  vars.MAXS = M.MAX_SOURCES
  vars.NAME = name
  return "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" .. gen.subst(PRELUDE, vars) .. gen.subst(kernel, vars)
end

return M
