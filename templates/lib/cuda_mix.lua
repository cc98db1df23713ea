-- lib/cuda_mix.lua: what the two CUDA mix templates share
-- (cuda/mix_online.lua, cuda/mix_twopass.lua): the kernel argument struct,
-- the launch data both report, the source's frame and the numerics below.
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

-- The source of a variant: storage helpers, the argument struct (from
-- lib/kernel_abi.lua), then the schedule's kernel text with vars
-- substituted (ABI, MAXS and NAME added).
function M.source(p, name, kernel, vars)
  vars.ABI = M.ABI
  vars.MAXS = M.MAX_SOURCES
  vars.NAME = name
  return "/* ---- storage helpers ---- */\n" .. storage.code(p.dtype, p.vec) ..
    "\n/* ---- kernel ---- */\n" .. kabi.struct("cuda_mix") .. "\n" .. gen.subst(kernel, vars)
end

return M
