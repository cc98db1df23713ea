-- lib/template.lua: the table every template starts from (cpu/*.lua,
-- cuda/*.lua), as gen/prelude.lua reads it.

local M = {}

-- The storage dtypes, every template's first parameter.
M.dtype = { name = "dtype", values = { "f32", "bf16", "f16" } }

-- A template's table for backend and op: params are the dtype, then the
-- template's own params in their order; fields (generic, builtin) are
-- copied in.
function M.new(backend, op, params, fields)
  local T = { backend = backend, op = op, params = { M.dtype } }
  for _, spec in ipairs(params) do
    T.params[#T.params + 1] = spec
  end
  for k, v in pairs(fields or {}) do
    T[k] = v
  end
  return T
end

return M
