-- lib/c_prefetch.lua: software prefetch statements for the CPU templates
-- (cpu/mix_fused.lua, cpu/phase2.lua).

local M = {}

-- Statements, one a line with `indent`, that prefetch every 64-byte line of
-- a loop step of `step_bytes` bytes starting at the C pointer expression
-- `ptr`, `ahead` bytes further on. `write` asks for the line to be owned
-- (it will be stored to), `level` is GCC's locality: 3 keeps it in L1, 2 in
-- L2. A step shorter than a line prefetches each time; the repeats hit
-- lines already on their way.
function M.lines(ptr, step_bytes, ahead, indent, write, level)
  local out = {}
  for off = 0, math.max(step_bytes, 64) - 64, 64 do
    out[#out + 1] = string.format("%s__builtin_prefetch((const char *)(%s) + %d, %d, %d);\n",
                                  indent, ptr, ahead + off, write and 1 or 0, level or 3)
  end
  return table.concat(out)
end

return M
