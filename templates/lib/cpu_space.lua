-- lib/cpu_space.lua: the rules every CPU template's parameter space shares
-- (cpu/mix.lua, cpu/phase1.lua, cpu/phase2.lua).

local M = {}

-- True when p is the template's generic variant (T.generic, any dtype).
function M.is_generic(T, p)
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
  local hd = problem.d // problem.heads
  if hd % (p.vec * p.unroll) ~= 0 then
    return false, string.format("head width %d is not a multiple of vec*unroll = %d",
                                hd, p.vec * p.unroll)
  end
  if p.threads > 1 and p.threads > device.units and not M.is_generic(T, p) then
    return false, string.format("%d threads exceed the device's %d cores",
                                p.threads, device.units)
  end
  return true
end

return M
