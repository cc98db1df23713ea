/*
 * argen.h - the kernel generator: Lua 5.4 templates, run sandboxed.
 *
 * A template (templates/<dialect>/<op>.lua) returns a table that describes
 * one kernel family: its parameter space, the constraints on it, whether a
 * variant applies to a problem on a device, and an emit function that
 * returns source text. gen/ loads templates in a fresh sandbox (no io, os,
 * load or file access other than require() of other templates), bounded in
 * memory and in instructions, so that no template can crash or hang the
 * host. Errors come back as "file:line: message".
 *
 * Ownership: every char* returned through an out-parameter is malloc'ed and
 * owned by the caller; arrays have their own free functions.
 */
#ifndef ARGEN_H
#define ARGEN_H

#include <stddef.h>
#include <stdint.h>

#define ARGEN_VERSION "0.1.0"

typedef struct argen argen;

/* The problem and device a variant is checked against (applies). Strings
 * are borrowed. */
typedef struct argen_problem {
    const char *op, *dtype, *form;
    int64_t d, t;
    int32_t n, heads, epilogue, s;
} argen_problem;

typedef struct argen_device {
    const char *backend, *arch;
    int32_t units;
} argen_device;

/* One variant of the space. */
typedef struct argen_variant {
    char *id;          /* e.g. "mix_c_f32_online_v8_u2_t2" */
    char *params_json; /* flat JSON object of the parameters and launch data */
} argen_variant;

/* Loads template `name` ("cpu/mix") from template_dir. 0 on success; on
 * failure *out is NULL and msg holds "file:line: message". */
int argen_open(const char *template_dir, const char *name, argen **out,
               char *msg, size_t msg_len);
void argen_close(argen *g); /* NULL is a no-op */
const char *argen_errmsg(const argen *g);

/* Template metadata (owned by g). */
const char *argen_name(const argen *g);    /* "cpu/mix" */
const char *argen_backend(const argen *g); /* "cpu" or "cuda" */
const char *argen_op(const argen *g);      /* "mix", "phase1", "phase2" */

/* Every variant of the space that satisfies the template's constraints, in
 * a stable order. */
int argen_enumerate(argen *g, argen_variant **out, size_t *count);
void argen_variants_free(argen_variant *v, size_t count);

/* 1 if the template prunes variant `id` for `problem` on `device` (it
 * applies, but the template's cost model says it cannot win there; why is
 * the reason), 0 if it is to be tuned, negative on a template error (why
 * holds the message). Templates without T.prune prune nothing. */
int argen_prune(argen *g, const char *id, const argen_problem *problem,
                const argen_device *device, char *why, size_t why_len);

/* 1 if variant `id` can run `problem` on `device`, 0 if not (why is set),
 * negative on a template error. */
int argen_applies(argen *g, const char *id, const argen_problem *problem,
                  const argen_device *device, char *why, size_t why_len);

/* Emits the source of variant `id`, with the generator's header comment.
 * *kernel_name is the entry symbol the source defines. */
int argen_emit(argen *g, const char *id, char **source, char **kernel_name,
               char **params_json);

/* The facts of a problem that variant id's source may be specialized for
 * (the template's `specialize`), as "name=value,..." in spec; "" when none.
 * 0, or -1 with the message in spec on a template error. */
int argen_specialize(argen *g, const char *id, const argen_problem *problem,
                     const argen_device *device, char *spec, size_t spec_len);

/* argen_emit for the facts spec (from argen_specialize; NULL or "": none). */
int argen_emit_for(argen *g, const char *id, const char *spec, char **source, char **kernel_name,
                   char **params_json);

/* The id of the template's generic variant (its fallback kernel) for a
 * storage dtype, in *id. */
int argen_generic(argen *g, const char *dtype, char **id);

/* The id (*id) and loop step (*step: the head width must be a multiple of
 * it) of the template's built-in kernel for an ISA level ("avx512", "avx2",
 * "sse2", "neon") and dtype. *id is NULL (and 0 returned) when the
 * template names none for that level. */
int argen_builtin(argen *g, const char *dtype, const char *level, char **id, int *step);

/* Loads a helper module ("lib/kernel_abi") that is not a kernel family:
 * only argen_module_text, argen_file_count/argen_file, argen_errmsg and
 * argen_close apply to the result. */
int argen_open_module(const char *template_dir, const char *name, argen **out,
                      char *msg, size_t msg_len);

/* Calls the module's function fn() and returns the string it returns in
 * *text (malloc'ed). Non-zero with argen_errmsg set on failure. */
int argen_module_text(argen *g, const char *fn, char **text);

/* The paths of every template file g has read so far (the template and all
 * it required), for a build's dependency file. Owned by g. */
size_t argen_file_count(const argen *g);
const char *argen_file(const argen *g, size_t i);

/* Lists template names under template_dir ("cpu/mix", "cuda/mix_online", ...). */
int argen_list_templates(const char *template_dir, char ***names,
                         size_t *count);
void argen_names_free(char **names, size_t count);

#endif /* ARGEN_H */
