-- lib/cuda_space.lua: the applicability rules every CUDA template shares
-- (cuda/mix_online.lua and cuda/mix_twopass.lua through lib/cuda_mix.lua,
-- cuda/phase1.lua, cuda/phase2.lua), as lib/cpu_space.lua holds the CPU
-- templates' rules.

local storage = require("lib/cuda_storage")
local kabi = require("lib/kernel_abi")

local M = {}

-- Whether p loads one element at a time or 16 bytes, the loads the phase
-- kernels and the mix backward take.
function M.scalar_or_16_bytes(p)
  return p.vec == 1 or p.vec * storage.esize[p.dtype] == 16
end

-- The launch data of a phase kernel (cuda/phase1.lua, cuda/phase2.lua) for
-- argument struct abi: one token per block of p.threads, loads of vec
-- elements, the query's 16-byte loads where vec is a multiple of 4, no
-- static dynamic shared memory (the runtime adds what a launch needs) and
-- no dmax; extra holds the op's own fields.
function M.phase_launch(p, abi, extra)
  local l = kabi.launch(abi)
  l.block = p.threads
  l.tokens_per_block = 1
  l.smem = 0
  l.align = p.vec * storage.esize[p.dtype]
  l.qalign = p.vec % 4 == 0 and 16 or 4
  l.dmax = 0
  for k, v in pairs(extra) do
    l[k] = v
  end
  return l
end

-- The checks of applies() that do not depend on the schedule: the op and
-- dtype match, the device is a CUDA one (or not given), N, S and H are
-- within the limits the kernel's argument struct and shared memory allow,
-- d fits the kernel's 32-bit element indices, H divides d and the head
-- width is a whole number of `vec`-element loads. limits may hold
-- max_sources (N, checked when given), max_sites (S) and max_heads (H).
-- Returns true, or false and the reason.
function M.applies(T, p, problem, device, limits)
  if problem.op ~= T.op then return false, "not a " .. T.op .. " problem" end
  if problem.dtype ~= p.dtype then return false, "dtype differs" end
  if device and device.backend ~= "" and device.backend ~= "cuda" then
    return false, "not a CUDA device"
  end
  local d, H, n = problem.d, problem.heads, problem.n
  if limits.max_sources and (n < 1 or n > limits.max_sources) then
    return false, string.format("N = %d is outside 1..%d", n, limits.max_sources)
  end
  if limits.max_sites then
    local s = problem.s or 0
    if s < 1 or s > limits.max_sites then
      return false, string.format("S = %d is outside 1..%d", s, limits.max_sites)
    end
  end
  if d < 1 or d > (1 << 30) then return false, "d is outside 1..2^30" end
  if limits.max_heads and (H < 1 or H > limits.max_heads) then
    return false, string.format("H = %d is outside 1..%d", H, limits.max_heads)
  end
  if H < 1 or d % H ~= 0 then return false, string.format("%d heads do not divide d = %d", H, d) end
  if (d // H) % p.vec ~= 0 then
    return false, string.format("head width %d is not a multiple of vec = %d", d // H, p.vec)
  end
  return true
end

return M
