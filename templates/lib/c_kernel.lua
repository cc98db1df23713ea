-- lib/c_kernel.lua: the frame every CPU kernel source shares (cpu/mix.lua,
-- cpu/mix_fused.lua, cpu/phase1.lua, cpu/phase2.lua).
--
-- The CPU backend loads each kernel from a shared object by name and finds
-- beside it two constants, <name>_abi and <name>_threads, and calls
--   void <name>(const struct <args> *a, int64_t t0, int64_t t1)
-- for a range of tokens it chose. That contract is the same for every
-- operation, so it is written here once; a template supplies only what
-- differs: the declarations before the entry (argument struct and helpers),
-- the comment that says what the entry does, and the entry's statements.

local M = {}

-- Returns the source text of one kernel. spec holds:
--   ctype    the C type of one storage element (storage_t)
--   decls    text between the storage typedef and the entry's constants;
--            it ends with its own line break
--   name     the entry symbol
--   threads  the most worker threads the runtime should spread tokens over
--   args     the argument struct's tag (e.g. "attnres_cpu_mix_args")
--   doc      the comment above the entry's definition
--   body     the entry's statements, each line indented and ended
function M.source(spec)
  return gen.subst([[
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef ${CTYPE} storage_t;

${decls}const int ${NAME}_abi = 1;
const int ${NAME}_threads = ${THREADS};

void ${NAME}(const struct ${ARGS} *a, int64_t t0, int64_t t1);

${doc}
void ${NAME}(const struct ${ARGS} *a, int64_t t0, int64_t t1)
{
${body}}
]], {
    CTYPE = spec.ctype,
    decls = spec.decls,
    NAME = spec.name,
    THREADS = spec.threads,
    ARGS = spec.args,
    doc = spec.doc,
    body = spec.body,
  })
end

return M
