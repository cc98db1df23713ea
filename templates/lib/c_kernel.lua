-- lib/c_kernel.lua: the frame every CPU kernel source shares (cpu/mix.lua,
-- cpu/mix_fused.lua, cpu/phase1.lua, cpu/phase2.lua).
--
-- The CPU backend loads each kernel from a shared object by name and finds
-- beside it two constants, <name>_abi and <name>_abi_op (the version of its
-- argument struct and the op it serves, lib/kernel_abi.lua), and calls
--   void <name>(const struct <args> *a, int64_t t0, int64_t t1)
-- for a range of tokens it chose. How many workers share the tokens is not
-- in the source: the runtime reads the thread count from the variant's
-- parameters (lib/cpu_space.lua), so that one binary serves every thread
-- count. (Kernels generated before exported it as <name>_threads, which
-- the runtime still honours.) That contract is the same for every
-- operation, so it is written here once, with the argument struct from its
-- one definition, and so is the comment that says what the entry does (it
-- depends on the op alone); a template supplies only what differs: the
-- declarations before the entry (helpers) and the entry's statements.

local kabi = require("lib/kernel_abi")

local M = {}

-- What the entry of each argument struct's op does, above its definition.
local ENTRY_DOC = {
  cpu_mix = [[
/* Mixes tokens [t0, t1): depth softmax of the folded query against the
 * RMS-normalised sources, applied to the raw rows. */]],
  cpu_phase1 = [[
/* Phase 1 of tokens [t0, t1): for every site j, the depth softmax of query j
 * against the RMS-normalised sources applied to the raw rows (o1_j), and the
 * log-sum-exp of its scores per head (lse_j). */]],
  cpu_phase2 = [[
/* Phase 2 of tokens [t0, t1): merges o1/lse with the partial sum b. */]],
  cpu_mix_backward = [[
/* The mix backward of tokens [t0, t1); t0 is the first token of a group. */]],
  cpu_phase1_backward = [[
/* The phase-1 backward of tokens [t0, t1); t0 is the first token of a group. */]],
  cpu_phase2_backward = [[
/* The phase-2 backward of tokens [t0, t1); t0 is the first token of a group. */]],
}

-- Returns the source text of one kernel. spec holds:
--   ctype    the C type of one storage element (storage_t)
--   abi      the argument struct's key in lib/kernel_abi.lua ("cpu_mix",
--            "cpu_phase1", "cpu_phase2")
--   decls    text between the argument struct and the entry's constants;
--            it ends with its own line break
--   name     the entry symbol; like everything else here, independent of
--            the thread count (lib/cpu_space.lua's kernel_name)
--   body     the entry's statements, each line indented and ended
--   tune     optional; "generic" compiles the kernel scheduled for a generic
--            x86-64 instead of the CPU that -march=native names (GCC, x86;
--            cpu/phase1.lua says why phase 1 asks for it)
function M.source(spec)
  local tune = ""
  if spec.tune == "generic" then
    tune = [[
/* Scheduled for a generic x86-64, not for the model that -march=native
 * names: GCC's znver3 tuning (GCC 12's reading of a Zen 4) parks pointers
 * in vector registers when the general ones run out, and each use then
 * waits for a move back. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#pragma GCC target("tune=generic")
#endif

]]
  elseif spec.tune ~= nil then
    error("lib/c_kernel: tune must be nil or \"generic\", not " .. tostring(spec.tune))
  end
  -- A thread count in the source would give every thread count its own
  -- source and its own compile of the same machine code.
  if spec.threads ~= nil then
    error("lib/c_kernel: the thread count is a launch parameter, not part of the source")
  end
  return tune .. gen.subst([[
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef ${CTYPE} storage_t;

${struct}
${decls}${abi_symbols}
void ${NAME}(const struct ${ARGS} *a, int64_t t0, int64_t t1);

${doc}
void ${NAME}(const struct ${ARGS} *a, int64_t t0, int64_t t1)
{
${body}}
]], {
    CTYPE = spec.ctype,
    struct = kabi.struct(spec.abi),
    decls = spec.decls,
    abi_symbols = kabi.cpu_symbols(spec.abi, spec.name),
    NAME = spec.name,
    ARGS = kabi.structs[spec.abi].name,
    doc = ENTRY_DOC[spec.abi] or error("lib/c_kernel: no CPU kernel ABI '" .. tostring(spec.abi) .. "'"),
    body = spec.body,
  })
end

return M
