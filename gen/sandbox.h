/*
 * sandbox.h - a Lua state in which templates cannot reach the host.
 *
 * The state has only the base functions that cannot touch files or load
 * code, plus string, table, math and utf8, and a require() that loads other
 * templates by name from the template directory. Memory and instruction
 * budgets stop a runaway template with an error instead of a hang.
 */
#ifndef ARGEN_SANDBOX_H
#define ARGEN_SANDBOX_H

#include <stddef.h>

#include <lua.h>

typedef struct sandbox sandbox;

/* Creates the state; template_dir is where require() looks. NULL on OOM. */
sandbox *sandbox_new(const char *template_dir);
void sandbox_free(sandbox *sb);
lua_State *sandbox_state(sandbox *sb);

/* Pushes the environment table in which templates run. */
void sandbox_push_env(sandbox *sb);

/* Loads templates/<name>.lua as a text chunk whose _ENV is the template
 * environment and runs it; pushes its single result. On failure pushes
 * nothing, returns non-zero and writes "file:line: message" to msg. */
int sandbox_run_file(sandbox *sb, const char *name, char *msg, size_t len);

/* Calls the function below nargs arguments on the stack, protected and
 * within the instruction budget; like lua_pcall, but on failure pops the
 * error and writes it to msg. */
int sandbox_call(sandbox *sb, int nargs, int nresults, char *msg, size_t len);

/* The paths of the template files read so far (each once, in the order
 * first read): the dependencies of whatever the state generated. */
size_t sandbox_file_count(const sandbox *sb);
const char *sandbox_file(const sandbox *sb, size_t i);

#endif
