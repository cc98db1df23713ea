-- lib/kernel_abi.lua: the one definition of every generated kernel's
-- argument struct, CPU and CUDA, and of each struct's ABI version.
--
-- Two kinds of code are compiled from it and must agree byte for byte: the
-- kernels (every template pastes struct(key) into the source it emits) and
-- the runtime, which fills the struct and passes it (attnres-gen writes
-- kernel_abi.h from header() at build time). Nothing else spells these
-- structs out.
--
-- The layout below is computed here under the LP64 model (pointers and
-- 64-bit integers 8 bytes, int32_t and float 4, natural alignment) and every
-- rendering asserts it at compile time: the runtime and CPU kernels check
-- sizeof and every offsetof, CUDA kernels check sizeof under NVRTC. So a
-- compiler that lays a struct out differently stops the build or the kernel
-- compile instead of corrupting a launch.
--
-- Each struct has its own version, the "ABI" a kernel declares (the CPU
-- symbol <kernel>_abi, the CUDA launch datum "abi") next to the op it
-- implements (<kernel>_abi_op, "abi_op"). The runtime loads a kernel only
-- if that version equals its own for that op, so bumping one op's version
-- retires that op's stored kernels and no other's. Changing a struct means
-- editing its entry here: the fields and, in the same entry, its version.

local M = {}

-- attnres_op values (runtime/include/attnres.h), the op tag a kernel
-- declares next to its version.
local OPS = { mix = 0, phase1 = 1, phase2 = 2, mix_backward = 3, phase1_backward = 4, phase2_backward = 5 }

-- Array bounds of the CUDA structs, passed by value (at most 4 KiB of
-- kernel parameters).
M.const = {
  AR_CUDA_MAX_SOURCES = 64,
  AR_CUDA_PHASE1_MAX_SOURCES = 64,
  AR_CUDA_PHASE1_MAX_SITES = 64,
}

-- A field is "type name" or "type name[BOUND]" with BOUND a key of
-- M.const, optionally with a comment: { "type name", "comment" }.

-- Runs of fields that several structs share word for word, so that each is
-- written once; fields(...) joins runs into one field list.
local function fields(...)
  local all = {}
  for _, run in ipairs({ ... }) do
    for _, f in ipairs(run) do all[#all + 1] = f end
  end
  return all
end

-- The gain-folded query and its softmax parameters.
local QUERY = { { "const float *query", "[d] fp32, gain-folded" }, "float scale", "float eps" }

-- A mix's partial sum, output and optional RMSNorm epilogue.
local MIX_OUTPUTS = {
  { "const void *partial", "additive form, else NULL" },
  "int64_t partial_stride",
  "float alpha",
  "void *out",
  "int64_t out_stride",
  { "const float *out_gain", "epilogue, else NULL" },
  "float out_eps",
  { "void *normed", "epilogue, else NULL" },
  "int64_t normed_stride",
}

-- A mix backward's form and incoming gradient.
local BACKWARD_INPUTS = {
  { "float alpha", "1 in the replace form" },
  { "int32_t accumulate", "1: add dsrc and dpartial into the buffers" },
  { "int32_t dsrc_f32", "1: every dsrc view is fp32, whatever the storage dtype" },
  { "const void *dout", "[T, d] incoming gradient" },
  "int64_t dout_stride",
}

-- A mix backward's partial-sum gradient and per-group workspace.
local BACKWARD_WORKSPACE = {
  { "void *dpartial", "additive form, else NULL" },
  "int64_t dpartial_stride",
  { "float *ws_du", "[groups, d] per-group sums of du" },
  { "float *ws_dalpha", "[groups] per-group sums of dalpha; NULL unless additive" },
}

-- A mix backward's output-norm epilogue: the forward's out and gain, the
-- gradient of normed, and the per-group sums of d(out_gain). dout may be
-- NULL when they are set (the loss reads normed alone).
local EPILOGUE_GRADIENTS = {
  { "const float *out_gain", "[d] fp32; epilogue, else NULL" },
  "float out_eps",
  { "const void *dnormed", "[T, d] gradient of normed; epilogue, else NULL" },
  "int64_t dnormed_stride",
  { "float *ws_dgout", "[groups, d] per-group sums of d(out_gain); epilogue, else NULL" },
}
local BACKWARD_EPILOGUE = fields({
  { "const void *out", "[T, d] the forward's out; epilogue, else NULL" },
  "int64_t out_stride",
}, EPILOGUE_GRADIENTS)

-- A phase-2 backward's forward inputs, and its per-token gradients with
-- the first workspace row (phase 2's epilogue recomputes out: no out).
local PHASE2_INPUTS = {
  { "const void *o1", "[T, d] this site's phase-1 output" },
  "int64_t o1_stride",
  { "const float *lse", "[T, heads] fp32, this site's phase-1 lse" },
  "int64_t lse_stride",
  { "const void *partial", "b [T, d] as the forward used it (after a fused add)" },
  "int64_t partial_stride",
}
local PHASE2_GRADIENTS = {
  { "const void *dout", "[T, d] gradient of out; NULL (epilogue only) for zero" },
  "int64_t dout_stride",
  { "void *do1", "[T, d] gradient of o1" },
  "int64_t do1_stride",
  { "float *dlse", "[T, heads] fp32 gradient of lse" },
  "int64_t dlse_stride",
  { "void *dpartial", "[T, d] gradient of b" },
  "int64_t dpartial_stride",
  { "void *dsublayer", "[T, d] fused add only (the same values as dpartial), else NULL" },
  "int64_t dsublayer_stride",
  { "float *ws_du", "[groups, d] per-group sums of du" },
}

M.structs = {
  cpu_mix = {
    version = 1, op = "mix", name = "attnres_cpu_mix_args",
    doc = "CPU mix kernels (cpu/mix.lua, cpu/mix_fused.lua). Strides count elements.",
    fields = fields({
      "int64_t d",
      "int32_t n", "int32_t heads",
      { "const void *const *src", "n pointers, each a [T, d] view" },
      { "const int64_t *src_stride", "n token strides" },
    }, QUERY, MIX_OUTPUTS),
  },
  cpu_phase1 = {
    version = 1, op = "phase1", name = "attnres_cpu_phase1_args",
    doc = "CPU phase-1 kernels (cpu/phase1.lua): n sources against s queries. Strides count elements.",
    fields = {
      "int64_t d",
      "int32_t n", "int32_t heads", "int32_t s",
      { "const void *const *src", "n pointers" },
      { "const int64_t *src_stride", "n token strides, never 0" },
      { "const float *queries", "[s, d]" },
      "float scale", "float eps",
      { "void *const *o1", "s pointers, each [T, d]" },
      "int64_t o1_stride",
      { "float *const *lse", "s pointers, each [T, heads]" },
      "int64_t lse_stride",
    },
  },
  cpu_phase2 = {
    version = 1, op = "phase2", name = "attnres_cpu_phase2_args",
    doc = "CPU phase-2 kernels (cpu/phase2.lua): one site's merge with the partial sum.",
    fields = {
      "int64_t d",
      "int32_t heads",
      "const void *o1",
      "int64_t o1_stride",
      "const float *lse",
      "int64_t lse_stride",
      "void *partial",
      "int64_t partial_stride",
      { "const void *sublayer", "NULL unless the add is fused" },
      "int64_t sublayer_stride",
      "const float *query",
      "float scale", "float eps",
      "void *out",
      "int64_t out_stride",
      "const float *out_gain",
      "float out_eps",
      { "void *normed", "NULL unless the epilogue runs" },
      "int64_t normed_stride",
    },
  },
  cpu_mix_backward = {
    version = 3, op = "mix_backward", name = "attnres_cpu_mix_backward_args",
    doc = "CPU mix backward kernels (cpu/mix_backward.lua). Strides count elements.",
    fields = fields({
      "int64_t d",
      "int32_t n", "int32_t heads",
      { "const void *const *src", "n pointers, each a [T, d] view" },
      { "const int64_t *src_stride", "n token strides, never 0" },
    }, QUERY, BACKWARD_INPUTS, {
      { "void *const *dsrc", "n pointers, each a [T, d] view" },
      { "const int64_t *dsrc_stride", "n token strides, never 0" },
    }, BACKWARD_WORKSPACE, {
      { "int64_t group", "tokens per group; a launch starts on a group's first token" },
    }, BACKWARD_EPILOGUE),
  },
  cpu_phase1_backward = {
    version = 1, op = "phase1_backward", name = "attnres_cpu_phase1_backward_args",
    doc = "CPU phase-1 backward kernels (cpu/phase1_backward.lua): n sources against s queries. Strides count elements.",
    fields = {
      "int64_t d",
      "int32_t n", "int32_t heads", "int32_t s",
      { "int32_t accumulate", "1: add dsrc into the buffers" },
      { "int32_t dsrc_f32", "1: every dsrc view is fp32, whatever the storage dtype" },
      { "const void *const *src", "n pointers, each a [T, d] view" },
      { "const int64_t *src_stride", "n token strides, never 0" },
      { "const float *queries", "[s, d] fp32, gain-folded" },
      "float scale", "float eps",
      { "const void *const *do1", "s pointers, each the [T, d] gradient of o1" },
      "int64_t do1_stride",
      { "const float *const *dlse", "s pointers, each [T, heads] fp32 or NULL (zero); NULL: zero for every site" },
      "int64_t dlse_stride",
      { "void *const *dsrc", "n pointers, each a [T, d] view" },
      { "const int64_t *dsrc_stride", "n token strides, never 0" },
      { "float *ws_du", "[groups, s, d] per-group sums of each site's du" },
      { "int64_t group", "tokens per group; a launch starts on a group's first token" },
    },
  },
  cpu_phase2_backward = {
    version = 1, op = "phase2_backward", name = "attnres_cpu_phase2_backward_args",
    doc = "CPU phase-2 backward kernels (cpu/phase2_backward.lua): one site. Strides count elements.",
    fields = fields({
      "int64_t d",
      "int32_t heads",
      { "int32_t accumulate", "1: add do1, dlse, dpartial and dsublayer into the buffers" },
    }, PHASE2_INPUTS, QUERY, PHASE2_GRADIENTS, {
      { "int64_t group", "tokens per group; a launch starts on a group's first token" },
    }, EPILOGUE_GRADIENTS),
  },
  cuda_mix = {
    version = 1, op = "mix", name = "attnres_cuda_mix_args",
    doc = "CUDA mix kernels (cuda/mix.lua), passed by value. Strides count elements.",
    fields = fields({
      { "const void *src[AR_CUDA_MAX_SOURCES]", "device pointers, [T, d] views" },
      { "int64_t src_stride[AR_CUDA_MAX_SOURCES]", "token strides" },
      "int64_t d",
      "int32_t n", "int32_t heads",
      "int64_t T",
    }, QUERY, MIX_OUTPUTS),
  },
  cuda_phase1 = {
    version = 1, op = "phase1", name = "attnres_cuda_phase1_args",
    doc = "CUDA phase-1 kernels (cuda/phase1.lua), passed by value. Strides count elements.",
    fields = {
      { "const void *src[AR_CUDA_PHASE1_MAX_SOURCES]", "[T, d] views" },
      "int64_t src_stride[AR_CUDA_PHASE1_MAX_SOURCES]",
      { "void *o1[AR_CUDA_PHASE1_MAX_SITES]", "[T, d] outputs, one per site" },
      { "float *lse[AR_CUDA_PHASE1_MAX_SITES]", "[T, H] fp32 outputs" },
      "int64_t d",
      "int32_t n", "int32_t heads", "int32_t s", "int32_t pad_",
      "int64_t T",
      { "const float *queries", "[S, d] fp32, gain-folded" },
      "float scale", "float eps",
      "int64_t o1_stride",
      "int64_t lse_stride",
    },
  },
  cuda_phase2 = {
    version = 1, op = "phase2", name = "attnres_cuda_phase2_args",
    doc = "CUDA phase-2 kernels (cuda/phase2.lua), passed by value. Strides count elements.",
    fields = {
      "int64_t d",
      "int32_t heads", "int32_t pad0_",
      "int64_t T",
      "const void *o1",
      "int64_t o1_stride",
      "const float *lse",
      "int64_t lse_stride",
      { "void *partial", "b: read, and written when sublayer is set" },
      "int64_t partial_stride",
      { "const void *sublayer", "f: NULL unless the add is fused" },
      "int64_t sublayer_stride",
      "const float *query",
      "float scale", "float eps",
      "void *out",
      "int64_t out_stride",
      { "const float *out_gain", "epilogue only" },
      "float out_eps", "float pad1_",
      { "void *normed", "NULL unless the epilogue runs" },
      "int64_t normed_stride",
    },
  },
  cuda_mix_backward = {
    version = 3, op = "mix_backward", name = "attnres_cuda_mix_backward_args",
    doc = "CUDA mix backward kernels (cuda/mix_backward.lua), both entries, passed by value. Strides count elements.",
    fields = fields({
      { "const void *src[AR_CUDA_MAX_SOURCES]", "device pointers, [T, d] views" },
      { "int64_t src_stride[AR_CUDA_MAX_SOURCES]", "token strides" },
      { "void *dsrc[AR_CUDA_MAX_SOURCES]", "[T, d] source gradients" },
      { "int64_t dsrc_stride[AR_CUDA_MAX_SOURCES]", "token strides" },
      "int64_t d",
      "int32_t n", "int32_t heads",
      "int64_t T",
    }, QUERY, BACKWARD_INPUTS, BACKWARD_WORKSPACE, {
      { "int64_t group", "tokens per group: one block's tokens" },
      { "int64_t groups", "ceil(T / group): the rows the second entry sums" },
      { "float *dquery", "[d] fp32: the sum of the groups' rows" },
      { "float *dalpha", "one fp32 sum of ws_dalpha, or NULL" },
    }, BACKWARD_EPILOGUE, {
      { "float *dout_gain", "[d] fp32: the sum of ws_dgout's rows, or NULL" },
    }),
  },
  cuda_phase1_backward = {
    version = 1, op = "phase1_backward", name = "attnres_cuda_phase1_backward_args",
    doc = "CUDA phase-1 backward kernels (cuda/phase1_backward.lua), both entries, by value. Strides count elements.",
    fields = {
      { "const void *src[AR_CUDA_PHASE1_MAX_SOURCES]", "[T, d] views" },
      "int64_t src_stride[AR_CUDA_PHASE1_MAX_SOURCES]",
      { "void *dsrc[AR_CUDA_PHASE1_MAX_SOURCES]", "[T, d] source gradients, summed over the sites" },
      "int64_t dsrc_stride[AR_CUDA_PHASE1_MAX_SOURCES]",
      { "const void *do1[AR_CUDA_PHASE1_MAX_SITES]", "[T, d] gradients of each site's o1" },
      { "const float *dlse[AR_CUDA_PHASE1_MAX_SITES]", "[T, heads] fp32 gradients of each site's lse; NULL: zero" },
      "int64_t d",
      "int32_t n", "int32_t heads", "int32_t s",
      { "int32_t accumulate", "1: add dsrc into the buffers" },
      { "int32_t dsrc_f32", "1: every dsrc view is fp32, whatever the storage dtype" },
      "int64_t T",
      { "const float *queries", "[s, d] fp32, gain-folded" },
      "float scale", "float eps",
      "int64_t do1_stride",
      "int64_t dlse_stride",
      { "float *ws_du", "[groups, s, d] per-group sums of each site's du" },
      { "int64_t group", "tokens per group: one block's tokens" },
      { "int64_t groups", "ceil(T / group): the rows the sum entry adds" },
      { "float *dqueries", "[s, d] fp32: the sum of the groups' rows" },
    },
  },
  cuda_phase2_backward = {
    version = 1, op = "phase2_backward", name = "attnres_cuda_phase2_backward_args",
    doc = "CUDA phase-2 backward kernels (cuda/phase2_backward.lua), all entries, by value. Strides count elements.",
    fields = fields({
      "int64_t d",
      "int32_t heads",
      { "int32_t accumulate", "1: add do1, dlse, dpartial and dsublayer into the buffers" },
      "int64_t T",
    }, PHASE2_INPUTS, QUERY, PHASE2_GRADIENTS, {
      { "int64_t group", "tokens per group: one block's tokens" },
      { "int64_t groups", "ceil(T / group): the rows the sum entry adds" },
      { "float *dquery", "[d] fp32: the sum of the groups' rows" },
    }, EPILOGUE_GRADIENTS, {
      { "float *dout_gain", "[d] fp32: the sum of ws_dgout's rows, or NULL" },
    }),
  },
}

-- The order in which header() writes the structs (pairs() has none).
local ORDER = { "cpu_mix", "cpu_phase1", "cpu_phase2", "cpu_mix_backward", "cpu_phase1_backward",
                "cpu_phase2_backward", "cuda_mix", "cuda_phase1", "cuda_phase2",
                "cuda_mix_backward", "cuda_phase1_backward", "cuda_phase2_backward" }

local SCALAR_SIZE = { int64_t = 8, int32_t = 4, float = 4 }
-- NVRTC has no <stdint.h>: CUDA sources spell the integer types out.
local CUDA_TYPE = { int64_t = "long long", int32_t = "int" }

-- Splits a field into type, name, bound and comment, with its size under LP64.
local function parse(f, key)
  local decl, comment = f, nil
  if type(f) == "table" then decl, comment = f[1], f[2] end
  local ty, name, bound = decl:match("^(.-)%s*([%a_][%w_]*)%[([%w_]+)%]$")
  if not ty then ty, name = decl:match("^(.-)%s*([%a_][%w_]*)$") end
  if not ty or ty == "" then error("kernel_abi " .. key .. ": cannot read field '" .. decl .. "'", 0) end
  local count = 1
  if bound then
    count = M.const[bound] or error("kernel_abi " .. key .. ": unknown bound " .. bound, 0)
  end
  local size
  if ty:find("*", 1, true) then
    size = 8
  else
    size = SCALAR_SIZE[ty] or error("kernel_abi " .. key .. ": unknown type '" .. ty .. "'", 0)
  end
  return { type = ty, name = name, bound = bound, count = count, size = size, comment = comment }
end

-- The fields of a struct with their offsets, and the struct's size.
function M.layout(key)
  local s = M.structs[key] or error("kernel_abi: no struct '" .. tostring(key) .. "'", 0)
  local fields, off, align = {}, 0, 1
  for _, f in ipairs(s.fields) do
    local p = parse(f, key)
    off = (off + p.size - 1) // p.size * p.size
    p.offset = off
    off = off + p.size * p.count
    if p.size > align then align = p.size end
    fields[#fields + 1] = p
  end
  return fields, (off + align - 1) // align * align
end

function M.version(key)
  return (M.structs[key] or error("kernel_abi: no struct '" .. tostring(key) .. "'", 0)).version
end

function M.op(key)
  return OPS[M.structs[key].op]
end

-- What a CPU kernel exports next to its entry point: the version of its
-- struct and the op it serves, which the runtime checks before a launch.
function M.cpu_symbols(key, kernel)
  return string.format("const int %s_abi = %d;\nconst int %s_abi_op = %d;\n",
                       kernel, M.version(key), kernel, M.op(key))
end

-- The same two facts as launch data (params JSON "abi" and "abi_op"), which
-- is what the runtime checks for CUDA kernels and the tuner records.
function M.launch(key)
  return { abi = M.version(key), abi_op = M.op(key) }
end

local function macro(key)
  return "AR_KERNEL_ABI_" .. key:upper()
end

-- The struct as C source. dialect "c": C11 for the runtime and CPU kernels,
-- checked with _Static_assert on sizeof and every offsetof; "cuda": NVRTC
-- C++ with the integer types spelled out and sizeof checked.
function M.struct(key, dialect)
  local s = M.structs[key] or error("kernel_abi: no struct '" .. tostring(key) .. "'", 0)
  dialect = dialect or (key:match("^cuda_") and "cuda" or "c")
  local fields, size = M.layout(key)
  local out = {
    string.format("/* %s\n * Argument struct %s, ABI version %d, from templates/lib/kernel_abi.lua. */",
                  s.doc, key, s.version),
    "typedef struct " .. s.name .. " {",
  }
  for _, f in ipairs(fields) do
    local ty = f.type
    if dialect == "cuda" then ty = CUDA_TYPE[ty] or ty end
    local sep = ty:sub(-1) == "*" and "" or " "
    local dim = f.bound and string.format("[%d]", f.count) or ""
    local line = string.format("    %s%s%s%s;", ty, sep, f.name, dim)
    if f.comment then line = line .. " /* " .. f.comment .. " */" end
    out[#out + 1] = line
  end
  out[#out + 1] = "} " .. s.name .. ";"
  if dialect == "cuda" then
    out[#out + 1] = string.format('static_assert(sizeof(%s) == %d, "%s: size differs from templates/lib/kernel_abi.lua");',
                                  s.name, size, s.name)
  else
    out[#out + 1] = string.format('_Static_assert(sizeof(%s) == %d, "%s: size");', s.name, size, s.name)
    for _, f in ipairs(fields) do
      out[#out + 1] = string.format('_Static_assert(__builtin_offsetof(%s, %s) == %d, "%s: offset of %s");',
                                    s.name, f.name, f.offset, s.name, f.name)
    end
  end
  return table.concat(out, "\n") .. "\n"
end

-- runtime/src's kernel_abi.h: every struct, its version and op macros, and
-- the array bounds.
function M.header()
  local out = {
    "/* Generated by attnres-gen (header lib/kernel_abi) from templates/lib/kernel_abi.lua. Do not edit.",
    " * The argument structs of generated kernels, as the runtime fills them;",
    " * the kernels paste the same text from the same file. */",
    "#ifndef AR_KERNEL_ABI_H",
    "#define AR_KERNEL_ABI_H",
    "",
    "#include <stdint.h>",
    "",
  }
  local names = {}
  for k in pairs(M.const) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    out[#out + 1] = string.format("#define %s %d", k, M.const[k])
  end
  out[#out + 1] = ""
  for _, key in ipairs(ORDER) do
    out[#out + 1] = string.format("#define %s %d /* version */", macro(key), M.version(key))
    out[#out + 1] = string.format("#define %s_OP %d /* the attnres_op it serves */", macro(key), M.op(key))
    out[#out + 1] = M.struct(key, "c")
  end
  out[#out + 1] = "#endif"
  return table.concat(out, "\n") .. "\n"
end

return M
