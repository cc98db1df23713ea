-- lib/cpu_space.lua: the rules every CPU template's parameter space shares
-- (cpu/mix.lua, cpu/phase1.lua, cpu/phase2.lua).

local M = {}

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

-- The checks of applies() that do not depend on the operation: the op and
-- dtype match, every loop's step divides the head width, and no more
-- threads than cores (the generic variant is exempt: the runtime caps its
-- workers at the core count). Returns true, or false and the reason.
function M.applies(T, p, problem, device)
  if problem.op ~= T.op then return false, "not a " .. T.op .. " problem" end
  if problem.dtype ~= p.dtype then return false, "dtype differs" end
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
