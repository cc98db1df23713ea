-- lib/cpu_space.lua: the rules every CPU template's parameter space shares
-- (cpu/mix.lua, cpu/mix_fused.lua, cpu/phase1.lua, cpu/phase2.lua).

local kabi = require("lib/kernel_abi")

local M = {}

-- The most worker threads a launch spreads tokens over: a launch parameter
-- (gen/prelude.lua). The runtime reads it from the variant's parameters,
-- so the source and the kernel name do not depend on it, and the variants
-- that differ only in it share one source and are compiled once.
M.threads = { name = "threads", values = { 1, 2, 4, 8, 16, 32, 64 }, launch = true }

-- A variant's id: the id of its source, which names the kernel, and the
-- thread count, so that ids, the database's candidates and winners keep
-- naming the thread count they were measured with.
function M.id(source_id, p)
  return string.format("%s_t%d", source_id, p.threads)
end

-- Defines the entries every CPU template has alike: T.id (source_id(p)
-- and the thread count), T.launch (the ABI version of argument struct abi)
-- and T.applies (M.applies alone; a template with more to check defines its
-- own after this call).
function M.entries(T, abi, source_id)
  function T.id(p)
    return M.id(source_id(p), p)
  end
  function T.launch()
    return { abi = kabi.version(abi) }
  end
  function T.applies(p, problem, device)
    return M.applies(T, p, problem, device)
  end
end

-- The entry symbol of the kernel generated for source_id.
function M.kernel_name(source_id)
  return "attnres_" .. source_id
end

-- True when p is the template's generic variant (T.generic, any dtype);
-- a template without one (cpu/mix_fused.lua) has none.
function M.is_generic(T, p)
  if not T.generic then return false end
  for k, v in pairs(T.generic) do
    if p[k] ~= v then return false end
  end
  return true
end

-- Scalar code gains nothing from several accumulators beyond two.
function M.constraint(p)
  return not (p.vec == 1 and p.unroll == 4)
end

-- 16 fp32 lanes are one AVX-512 register. An x86-64 CPU without AVX-512
-- gets them as pairs of AVX2 halves, which its 16 vector registers cannot
-- hold: on a Zen 3 guest the 16-lane fused mix ran K3's shape at 2.7 GB/s
-- against 11.3-12.6 for 8 lanes (bench/results/cpu-avx2-2026-12-02.md), and
-- each such variant took 8-20 s to compile instead of 2-3.
local function lanes_fit(p, device)
  local x86 = device.arch:match("^x86_64") ~= nil
  return not (x86 and p.vec == 16 and device.arch ~= "x86_64-avx512")
end

-- The checks of applies() that do not depend on the operation: the op and
-- dtype match, the vectors fit the ISA, every loop's step divides the head
-- width, and no more threads than cores (the generic variant is exempt: the
-- runtime caps its workers at the core count). Returns true, or false and
-- the reason.
function M.applies(T, p, problem, device)
  if problem.op ~= T.op then return false, "not a " .. T.op .. " problem" end
  if problem.dtype ~= p.dtype then return false, "dtype differs" end
  if not lanes_fit(p, device) then
    return false, "16 lanes need AVX-512 (" .. device.arch .. " splits them into pairs)"
  end
  -- A loop's step: vec * unroll lanes, or the template's own `step`.
  local step = T.step and T.step(p) or p.vec * p.unroll
  local hd = problem.d // problem.heads
  if hd % step ~= 0 then
    return false, string.format("head width %d is not a multiple of the loop step %d",
                                hd, step)
  end
  if p.threads > 1 and p.threads > device.units and not M.is_generic(T, p) then
    return false, string.format("%d threads exceed the device's %d cores",
                                p.threads, device.units)
  end
  return true
end

return M
