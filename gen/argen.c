/* argen.c - template loading, enumeration and emission; see argen.h. */
#include "argen.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <lauxlib.h>

#include "sandbox.h"

extern const char argen_prelude_lua[]; /* gen/prelude.lua, embedded */

struct argen {
    sandbox *sb;
    int prelude_ref, template_ref;
    char name[256], backend[32], op[32];
    char file[300];
    char msg[2048];
};

static int load_prelude(argen *g)
{
    lua_State *L = sandbox_state(g->sb);
    lua_pushstring(L, ARGEN_VERSION);
    lua_setglobal(L, "GENERATOR_VERSION");
    if (luaL_loadbufferx(L, argen_prelude_lua, strlen(argen_prelude_lua),
                         "@gen/prelude.lua", "t") != LUA_OK) {
        snprintf(g->msg, sizeof g->msg, "%s", lua_tostring(L, -1));
        lua_pop(L, 1);
        return 1;
    }
    if (sandbox_call(g->sb, 0, 1, g->msg, sizeof g->msg))
        return 1;
    g->prelude_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    /* Expose prelude.helpers to templates as the global `gen`. */
    sandbox_push_env(g->sb);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->prelude_ref);
    lua_getfield(L, -1, "helpers");
    lua_setfield(L, -3, "gen");
    lua_pop(L, 2);
    return 0;
}

/* Pushes prelude[fn] and the template table, ready for more arguments. */
static void push_call(argen *g, const char *fn)
{
    lua_State *L = sandbox_state(g->sb);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->prelude_ref);
    lua_getfield(L, -1, fn);
    lua_remove(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->template_ref);
}

static void copy_string_field(lua_State *L, const char *field, char *dst,
                              size_t len)
{
    lua_getfield(L, -1, field);
    const char *s = lua_tostring(L, -1);
    snprintf(dst, len, "%s", s ? s : "");
    lua_pop(L, 1);
}

int argen_open(const char *template_dir, const char *name, argen **out,
               char *msg, size_t msg_len)
{
    *out = NULL;
    argen *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(msg, msg_len, "out of memory");
        return 1;
    }
    g->sb = sandbox_new(template_dir);
    if (!g->sb) {
        free(g);
        snprintf(msg, msg_len, "out of memory creating the Lua state");
        return 1;
    }
    snprintf(g->name, sizeof g->name, "%s", name);
    snprintf(g->file, sizeof g->file, "templates/%s.lua", name);
    lua_State *L = sandbox_state(g->sb);
    if (load_prelude(g) || sandbox_run_file(g->sb, name, g->msg, sizeof g->msg))
        goto fail;
    g->template_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->prelude_ref);
    lua_getfield(L, -1, "validate");
    lua_remove(L, -2);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->template_ref);
    lua_pushstring(L, g->file);
    if (sandbox_call(g->sb, 2, 0, g->msg, sizeof g->msg))
        goto fail;
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->template_ref);
    copy_string_field(L, "backend", g->backend, sizeof g->backend);
    copy_string_field(L, "op", g->op, sizeof g->op);
    lua_pop(L, 1);
    *out = g;
    return 0;
fail:
    snprintf(msg, msg_len, "%s", g->msg);
    argen_close(g);
    return 1;
}

int argen_open_module(const char *template_dir, const char *name, argen **out,
                      char *msg, size_t msg_len)
{
    *out = NULL;
    argen *g = calloc(1, sizeof *g);
    if (!g || !(g->sb = sandbox_new(template_dir))) {
        free(g);
        snprintf(msg, msg_len, "out of memory creating the Lua state");
        return 1;
    }
    snprintf(g->name, sizeof g->name, "%s", name);
    snprintf(g->file, sizeof g->file, "templates/%s.lua", name);
    if (load_prelude(g) || sandbox_run_file(g->sb, name, g->msg, sizeof g->msg)) {
        snprintf(msg, msg_len, "%s", g->msg);
        argen_close(g);
        return 1;
    }
    g->template_ref = luaL_ref(sandbox_state(g->sb), LUA_REGISTRYINDEX);
    *out = g;
    return 0;
}

/* Takes the string on top of the Lua stack: a copy to free in *out, and
 * it off the stack; 1 with the message in g->msg when memory runs out. */
static int pop_string(argen *g, char **out)
{
    lua_State *L = sandbox_state(g->sb);
    *out = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (!*out) {
        snprintf(g->msg, sizeof g->msg, "out of memory");
        return 1;
    }
    return 0;
}

int argen_module_text(argen *g, const char *fn, char **text)
{
    *text = NULL;
    lua_State *L = sandbox_state(g->sb);
    lua_rawgeti(L, LUA_REGISTRYINDEX, g->template_ref);
    if (!lua_istable(L, -1) || lua_getfield(L, -1, fn) != LUA_TFUNCTION) {
        lua_pop(L, lua_istable(L, -1) ? 2 : 1);
        snprintf(g->msg, sizeof g->msg, "%s: no function '%s'", g->file, fn);
        return 1;
    }
    lua_remove(L, -2);
    if (sandbox_call(g->sb, 0, 1, g->msg, sizeof g->msg))
        return 1;
    if (lua_type(L, -1) != LUA_TSTRING) {
        lua_pop(L, 1);
        snprintf(g->msg, sizeof g->msg, "%s: %s() must return a string", g->file, fn);
        return 1;
    }
    return pop_string(g, text);
}

size_t argen_file_count(const argen *g) { return sandbox_file_count(g->sb); }
const char *argen_file(const argen *g, size_t i) { return sandbox_file(g->sb, i); }

void argen_close(argen *g)
{
    if (!g)
        return;
    sandbox_free(g->sb);
    free(g);
}

const char *argen_errmsg(const argen *g) { return g ? g->msg : "no generator"; }
const char *argen_name(const argen *g) { return g->name; }
const char *argen_backend(const argen *g) { return g->backend; }
const char *argen_op(const argen *g) { return g->op; }

int argen_enumerate(argen *g, argen_variant **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    lua_State *L = sandbox_state(g->sb);
    push_call(g, "list");
    if (sandbox_call(g->sb, 1, 1, g->msg, sizeof g->msg))
        return 1;
    size_t n = (size_t)luaL_len(L, -1);
    argen_variant *v = calloc(n ? n : 1, sizeof *v);
    if (!v) {
        lua_pop(L, 1);
        snprintf(g->msg, sizeof g->msg, "out of memory");
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, -1, (lua_Integer)i + 1);
        lua_getfield(L, -1, "id");
        lua_getfield(L, -2, "json");
        const char *id = lua_tostring(L, -2), *json = lua_tostring(L, -1);
        v[i].id = strdup(id ? id : "");
        v[i].params_json = strdup(json ? json : "{}");
        lua_pop(L, 3);
        if (!v[i].id || !v[i].params_json) {
            argen_variants_free(v, i + 1);
            lua_pop(L, 1);
            snprintf(g->msg, sizeof g->msg, "out of memory");
            return 1;
        }
    }
    lua_pop(L, 1);
    *out = v;
    *count = n;
    return 0;
}

void argen_variants_free(argen_variant *v, size_t count)
{
    if (!v)
        return;
    for (size_t i = 0; i < count; i++) {
        free(v[i].id);
        free(v[i].params_json);
    }
    free(v);
}

/* Sets field name of the table on top of the stack. */
static void set_string(lua_State *L, const char *name, const char *value)
{
    lua_pushstring(L, value);
    lua_setfield(L, -2, name);
}

static void set_integer(lua_State *L, const char *name, lua_Integer value)
{
    lua_pushinteger(L, value);
    lua_setfield(L, -2, name);
}

static void push_problem(lua_State *L, const argen_problem *p)
{
    lua_newtable(L);
    set_string(L, "op", p->op ? p->op : "mix");
    set_string(L, "dtype", p->dtype ? p->dtype : "f32");
    set_string(L, "form", p->form ? p->form : "replace");
    set_integer(L, "d", p->d);
    set_integer(L, "t", p->t);
    set_integer(L, "n", p->n);
    set_integer(L, "heads", p->heads);
    lua_pushboolean(L, p->epilogue);
    lua_setfield(L, -2, "epilogue");
    set_integer(L, "s", p->s);
}

static void push_device(lua_State *L, const argen_device *d)
{
    lua_newtable(L);
    set_string(L, "backend", d && d->backend ? d->backend : "");
    set_string(L, "arch", d && d->arch ? d->arch : "");
    set_integer(L, "units", d ? d->units : 1);
}

/* Calls the prelude's fn(T, id, problem, device) for nresults results,
 * left on the stack; -1 with the message in why on a template error. */
static int call_for_problem(argen *g, const char *fn, const char *id, const argen_problem *problem,
                            const argen_device *device, int nresults, char *why, size_t why_len)
{
    lua_State *L = sandbox_state(g->sb);
    push_call(g, fn);
    lua_pushstring(L, id);
    push_problem(L, problem);
    push_device(L, device);
    if (sandbox_call(g->sb, 4, nresults, g->msg, sizeof g->msg)) {
        snprintf(why, why_len, "%s", g->msg);
        return -1;
    }
    return 0;
}

int argen_applies(argen *g, const char *id, const argen_problem *problem,
                  const argen_device *device, char *why, size_t why_len)
{
    lua_State *L = sandbox_state(g->sb);
    if (call_for_problem(g, "applies", id, problem, device, 2, why, why_len))
        return -1;
    int ok = lua_toboolean(L, -2);
    const char *reason = lua_tostring(L, -1);
    snprintf(why, why_len, "%s", ok ? "" : (reason ? reason : "not applicable"));
    lua_pop(L, 2);
    return ok;
}

/* Calls the prelude's fn for one result, a string or nil, copied into buf
 * (nil as ""): the length the string needed, as snprintf counts it, with
 * *given whether there was one; -1 with the message in buf on a template
 * error. */
static int call_for_text(argen *g, const char *fn, const char *id, const argen_problem *problem,
                         const argen_device *device, char *buf, size_t len, int *given)
{
    lua_State *L = sandbox_state(g->sb);
    if (call_for_problem(g, fn, id, problem, device, 1, buf, len))
        return -1;
    const char *text = lua_tostring(L, -1);
    *given = text != NULL;
    const int n = snprintf(buf, len, "%s", text ? text : "");
    lua_pop(L, 1);
    return n < 0 ? 0 : n;
}

int argen_prune(argen *g, const char *id, const argen_problem *problem,
                const argen_device *device, char *why, size_t why_len)
{
    int pruned;
    if (call_for_text(g, "prune", id, problem, device, why, why_len, &pruned) < 0)
        return -1;
    return pruned;
}

int argen_specialize(argen *g, const char *id, const argen_problem *problem,
                     const argen_device *device, char *spec, size_t spec_len)
{
    int given;
    const int n = call_for_text(g, "specialize", id, problem, device, spec, spec_len, &given);
    if (n < 0)
        return -1;
    if ((size_t)n >= spec_len) {
        snprintf(g->msg, sizeof g->msg, "%s: specialization of %s too long", g->file, id);
        snprintf(spec, spec_len, "%s", g->msg);
        return -1;
    }
    return 0;
}

int argen_emit(argen *g, const char *id, char **source, char **kernel_name,
               char **params_json)
{
    return argen_emit_for(g, id, NULL, source, kernel_name, params_json);
}

int argen_emit_for(argen *g, const char *id, const char *spec, char **source, char **kernel_name,
                   char **params_json)
{
    *source = *kernel_name = NULL;
    if (params_json)
        *params_json = NULL;
    lua_State *L = sandbox_state(g->sb);
    push_call(g, "emit");
    lua_pushstring(L, g->file);
    lua_pushstring(L, id);
    if (spec)
        lua_pushstring(L, spec);
    else
        lua_pushnil(L);
    if (sandbox_call(g->sb, 4, 3, g->msg, sizeof g->msg))
        return 1;
    *source = strdup(lua_tostring(L, -3));
    *kernel_name = strdup(lua_tostring(L, -2));
    if (params_json)
        *params_json = strdup(lua_tostring(L, -1));
    lua_pop(L, 3);
    if (!*source || !*kernel_name || (params_json && !*params_json)) {
        free(*source);
        free(*kernel_name);
        if (params_json)
            free(*params_json);
        *source = *kernel_name = NULL;
        snprintf(g->msg, sizeof g->msg, "out of memory");
        return 1;
    }
    return 0;
}

int argen_generic(argen *g, const char *dtype, char **id)
{
    *id = NULL;
    lua_State *L = sandbox_state(g->sb);
    push_call(g, "generic");
    lua_pushstring(L, g->file);
    lua_pushstring(L, dtype);
    if (sandbox_call(g->sb, 3, 1, g->msg, sizeof g->msg))
        return 1;
    return pop_string(g, id);
}

int argen_builtin(argen *g, const char *dtype, const char *level, char **id, int *step)
{
    *id = NULL;
    *step = 0;
    lua_State *L = sandbox_state(g->sb);
    push_call(g, "builtin");
    lua_pushstring(L, g->file);
    lua_pushstring(L, dtype);
    lua_pushstring(L, level);
    if (sandbox_call(g->sb, 4, 2, g->msg, sizeof g->msg))
        return 1;
    int ok = 0;
    if (lua_isnil(L, -2)) {
        ok = 1;
    } else if (lua_isinteger(L, -1) && lua_tointeger(L, -1) > 0 && lua_tointeger(L, -1) < (1 << 20)) {
        *step = (int)lua_tointeger(L, -1);
        *id = strdup(lua_tostring(L, -2));
        ok = *id != NULL;
        if (!ok)
            snprintf(g->msg, sizeof g->msg, "out of memory");
    } else {
        snprintf(g->msg, sizeof g->msg, "%s: the built-in variant's loop step is not a positive integer", g->file);
    }
    lua_pop(L, 2);
    return ok ? 0 : 1;
}

/* Collects "<dialect>/<op>" for each templates/<dialect>/<op>.lua. */
int argen_list_templates(const char *template_dir, char ***names,
                         size_t *count)
{
    *names = NULL;
    *count = 0;
    static const char *const dialects[] = {"cpu", "cuda", NULL};
    size_t n = 0, cap = 0;
    char **out = NULL;
    for (const char *const *dl = dialects; *dl; dl++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", template_dir, *dl);
        DIR *dp = opendir(dir);
        if (!dp)
            continue;
        struct dirent *e;
        while ((e = readdir(dp))) {
            size_t len = strlen(e->d_name);
            if (len < 5 || strcmp(e->d_name + len - 4, ".lua") != 0)
                continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                char **nn = realloc(out, cap * sizeof *nn);
                if (!nn) {
                    closedir(dp);
                    argen_names_free(out, n);
                    return 1;
                }
                out = nn;
            }
            char name[600];
            snprintf(name, sizeof name, "%s/%.*s", *dl, (int)(len - 4),
                     e->d_name);
            out[n] = strdup(name);
            if (!out[n]) {
                closedir(dp);
                argen_names_free(out, n);
                return 1;
            }
            n++;
        }
        closedir(dp);
    }
    /* Sorted, so listings are stable across file systems. */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && strcmp(out[j - 1], out[j]) > 0; j--) {
            char *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    *names = out;
    *count = n;
    return 0;
}

void argen_names_free(char **names, size_t count)
{
    if (!names)
        return;
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}
