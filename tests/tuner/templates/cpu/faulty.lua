-- cpu/faulty.lua: a test template whose variants misbehave on purpose, to
-- show that the tuner records each failure with its status and goes on,
-- and one that is right but far too slow, to show that screening cuts it
-- short during its launch.
-- It reuses the real cpu/mix template and injects one fault per variant.

local mix = require("cpu/mix")

local T = {
  backend = "cpu",
  op = "mix",
  params = {
    { name = "dtype", values = { "f32", "bf16", "f16" } },
    { name = "fault", values = { "crash", "wrong", "hang", "nocompile", "slow" } },
  },
}

function T.id(p)
  return string.format("faulty_c_%s_%s", p.dtype, p.fault)
end

local function base(p)
  return { dtype = p.dtype, schedule = "online", vec = 1, unroll = 1, threads = 1 }
end

-- The runtime reads a CPU kernel's thread count from its parameters; these
-- variants run on one thread, as their base does.
function T.launch(p)
  return { threads = base(p).threads }
end

function T.applies(p, problem, device)
  return mix.applies(base(p), problem, device)
end

function T.emit(p)
  local src, name = mix.emit(base(p))
  local kernel = "attnres_" .. T.id(p)
  src = src:gsub(name, kernel)
  local entry = "void " .. kernel .. "(const struct attnres_cpu_mix_args *a, int64_t t0, int64_t t1)\n{\n"
  local inject = {
    crash = "    *(volatile int *)(uintptr_t)8 = 1; /* fault: segmentation violation */\n",
    hang = "    for (volatile int spin = 1; spin;) { } /* fault: never returns */\n",
    nocompile = "    this is not C; /* fault: compile error */\n",
    wrong = "",
    slow = "    for (volatile long spin = 0; spin < 300000000L; spin++) { } /* fault: far too slow */\n",
  }
  src = src:gsub(entry:gsub("%p", "%%%0"), function(m) return m .. inject[p.fault] end, 1)
  if p.fault == "wrong" then
    -- fault: every output 1% too large
    src = src:gsub("store_row%(out %+ k, o%);", "store_row(out + k, o * 1.01f);")
  end
  return src, kernel
end

return T
