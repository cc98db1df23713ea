-- lib/cpu_backward_rows.lua: the parameter space the phase backwards' CPU
-- templates share (cpu/phase1_backward.lua, cpu/phase2_backward.lua): rows
-- only, `vec` lanes, `unroll` vectors a step, fresh gradients stored cached
-- or streamed, and the thread count set at launch. Each template names its
-- own op and ids; this module makes its template table and the rules that
-- hold for both.

local template = require("lib/template")
local space = require("lib/cpu_space")

local M = {}

-- The template of `op` over the shared space, with its generic and
-- built-in kernels. The built-ins take the row-layout choices of
-- cpu/mix_backward.lua, whose sweeps these resemble (one register of
-- lanes; two accumulators where the registers hold them with room to
-- spare, 32 zmm and 16 ymm; SSE2 and NEON 8 lanes as two registers, once,
-- a step of 8 that fits the most head widths; AVX2 streaming its fresh
-- gradients, as the mix backward's built-ins do), not yet measured for
-- these kernels.
function M.template(op)
  local T = template.new("cpu", op, {
    { name = "vec", values = { 1, 8, 16 } },
    { name = "unroll", values = { 1, 2 } },
    { name = "store", values = { "cached", "stream" } },
    space.threads, -- 1, 2, 4, ... 64, set at launch (lib/cpu_space.lua)
  }, {
    -- The runtime's built-in fallback: scalar code that fits every shape,
    -- spread over all cores.
    generic = { vec = 1, unroll = 1, store = "cached", threads = 64 },
    builtin = {
      avx512 = { vec = 16, unroll = 2, store = "cached", threads = 64 },
      avx2 = { vec = 8, unroll = 2, store = "stream", threads = 64 },
      sse2 = { vec = 8, unroll = 1, store = "cached", threads = 64 },
      neon = { vec = 8, unroll = 1, store = "cached", threads = 64 },
    },
  })
  -- AVX512-BF16 CPUs: the AVX-512 variant, compiled with it (see cpu/mix_fused.lua).
  T.builtin.avx512bf16 = T.builtin.avx512
  -- Streamed stores are vector stores: scalar ones are narrower than a
  -- non-temporal store.
  function T.constraint(p)
    return space.constraint(p) and (p.store == "cached" or p.vec > 1)
  end
  -- A step of a sweep covers unroll vectors.
  function T.step(p)
    return p.vec * p.unroll
  end
  local function source_id(p)
    return string.format("%s_c_%s_v%d_u%d%s", op, p.dtype, p.vec, p.unroll, p.store == "stream" and "_ss" or "")
  end
  space.entries(T, "cpu_" .. op, source_id)
  return T, source_id
end

return M
