/* sandbox.c - the Lua state templates run in; see sandbox.h. */
#include "sandbox.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lualib.h>

/* Budgets: generous for real templates, small enough to stop a loop fast. */
#define SANDBOX_MEMORY_LIMIT (256u << 20)
#define SANDBOX_INSTRUCTION_LIMIT 100000000LL /* ~750x the largest real call */
#define SANDBOX_HOOK_STEP 10000

struct sandbox {
    lua_State *L;
    size_t used;
    long long instructions;
    char template_dir[4096];
    int env_ref;
    int loaded_ref; /* name -> result of require() */
    /* Every file read so far, in order, so that a build can depend on each
     * one (attnres-gen's depfile). */
    char **files;
    size_t nfiles;
};

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    sandbox *sb = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        sb->used -= old;
        return NULL;
    }
    if (nsize > old && sb->used + (nsize - old) > SANDBOX_MEMORY_LIMIT)
        return NULL; /* Lua turns this into a "not enough memory" error. */
    void *p = realloc(ptr, nsize);
    if (p)
        sb->used = sb->used - old + nsize;
    return p;
}

static void sandbox_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    sandbox *sb;
    lua_getallocf(L, (void **)&sb);
    sb->instructions += SANDBOX_HOOK_STEP;
    if (sb->instructions > SANDBOX_INSTRUCTION_LIMIT)
        luaL_error(L, "template exceeded its instruction budget");
}

/* Reads a whole file; NULL if it cannot be read. */
static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? cap * 2 : 16384;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Template names are relative paths of [a-z0-9_] parts: no "..", no "/". */
static int name_is_safe(const char *name)
{
    if (!*name || *name == '/')
        return 0;
    for (const char *p = name; *p; p++) {
        char c = *p;
        int ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '_' || (c == '/' && p[1] && p[1] != '/');
        if (!ok)
            return 0;
    }
    return 1;
}

/* Adds path to the files read; non-zero when out of memory. */
static int note_file(sandbox *sb, const char *path)
{
    for (size_t i = 0; i < sb->nfiles; i++)
        if (strcmp(sb->files[i], path) == 0)
            return 0;
    char **grown = realloc(sb->files, (sb->nfiles + 1) * sizeof *grown);
    if (!grown)
        return 1;
    sb->files = grown;
    size_t n = strlen(path) + 1;
    if (!(sb->files[sb->nfiles] = malloc(n)))
        return 1;
    memcpy(sb->files[sb->nfiles++], path, n);
    return 0;
}

/* Loads the chunk of template `name` with the template environment as its
 * _ENV and pushes it (or an error message, returning non-zero). */
static int load_template_chunk(sandbox *sb, const char *name)
{
    lua_State *L = sb->L;
    if (!name_is_safe(name)) {
        lua_pushfstring(L, "invalid template name '%s'", name);
        return 1;
    }
    char path[4400], chunk[300];
    snprintf(path, sizeof path, "%s/%s.lua", sb->template_dir, name);
    snprintf(chunk, sizeof chunk, "@templates/%s.lua", name);
    size_t len = 0;
    char *text = read_text(path, &len);
    if (!text) {
        lua_pushfstring(L, "cannot read template '%s' (%s)", name, path);
        return 1;
    }
    int rc = luaL_loadbufferx(L, text, len, chunk, "t");
    free(text);
    if (rc == LUA_OK && note_file(sb, path)) {
        lua_pop(L, 1);
        lua_pushliteral(L, "out of memory recording the template files read");
        return 1;
    }
    if (rc != LUA_OK)
        return 1;
    lua_rawgeti(L, LUA_REGISTRYINDEX, sb->env_ref);
    lua_setupvalue(L, -2, 1); /* the first upvalue of a main chunk is _ENV */
    return 0;
}

/* require(name) for templates: loads templates/<name>.lua once. */
static int sandbox_require(lua_State *L)
{
    const char *name = luaL_checkstring(L, 1);
    sandbox *sb;
    lua_getallocf(L, (void **)&sb);
    lua_rawgeti(L, LUA_REGISTRYINDEX, sb->loaded_ref);
    if (lua_getfield(L, -1, name) != LUA_TNIL)
        return 1;
    lua_pop(L, 1);
    if (load_template_chunk(sb, name))
        return lua_error(L);
    lua_call(L, 0, 1);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, name);
    return 1;
}

/* pcall/xpcall for templates: like the originals, except that running out
 * of the instruction budget cannot be caught, so a template that loops
 * around a pcall still stops. */
static int budget_spent(lua_State *L)
{
    sandbox *sb;
    lua_getallocf(L, (void **)&sb);
    return sb->instructions > SANDBOX_INSTRUCTION_LIMIT;
}

static int sandbox_pcall(lua_State *L)
{
    luaL_checkany(L, 1);
    lua_pushboolean(L, 1);
    lua_insert(L, 1); /* true, f, args... */
    int status = lua_pcall(L, lua_gettop(L) - 2, LUA_MULTRET, 0);
    if (status != LUA_OK) {
        if (budget_spent(L))
            return lua_error(L);
        lua_pushboolean(L, 0);
        lua_pushvalue(L, -2);
        return 2; /* false, message */
    }
    return lua_gettop(L);
}

static int sandbox_xpcall(lua_State *L)
{
    int n = lua_gettop(L);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    lua_pushboolean(L, 1);
    lua_pushvalue(L, 1);
    lua_rotate(L, 3, 2); /* f, handler, true, f, args... */
    int status = lua_pcall(L, n - 2, LUA_MULTRET, 2);
    if (status != LUA_OK) {
        if (budget_spent(L))
            return lua_error(L);
        lua_pushboolean(L, 0);
        lua_pushvalue(L, -2);
        return 2;
    }
    return lua_gettop(L) - 2;
}

/* Copies the named fields of the table on top into the table at env. */
static void copy_fields(lua_State *L, int env, const char *const *names)
{
    for (; *names; names++) {
        lua_getfield(L, -1, *names);
        lua_setfield(L, env, *names);
    }
}

static void build_env(sandbox *sb)
{
    lua_State *L = sb->L;
    static const char *const base_safe[] = {
        "assert", "error", "ipairs", "next", "pairs", "select",
        "tonumber", "tostring", "type", "rawequal", "rawget", "rawlen",
        "rawset", "setmetatable", "getmetatable", NULL};
    lua_newtable(L);
    int env = lua_gettop(L);
    lua_pushglobaltable(L);
    copy_fields(L, env, base_safe);
    lua_pop(L, 1);
    /* Libraries are copied into fresh tables so templates cannot alter
     * the ones the prelude uses. */
    static const char *const libs[] = {"string", "table", "math", "utf8", NULL};
    for (const char *const *lib = libs; *lib; lib++) {
        lua_newtable(L);
        lua_getglobal(L, *lib);
        lua_pushnil(L);
        while (lua_next(L, -2)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_settable(L, -5);
        }
        lua_pop(L, 1);
        lua_setfield(L, env, *lib);
    }
    lua_pushcfunction(L, sandbox_require);
    lua_setfield(L, env, "require");
    lua_pushcfunction(L, sandbox_pcall);
    lua_setfield(L, env, "pcall");
    lua_pushcfunction(L, sandbox_xpcall);
    lua_setfield(L, env, "xpcall");
    lua_pushvalue(L, env);
    lua_setfield(L, env, "_G");
    sb->env_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

sandbox *sandbox_new(const char *template_dir)
{
    sandbox *sb = calloc(1, sizeof *sb);
    if (!sb)
        return NULL;
    snprintf(sb->template_dir, sizeof sb->template_dir, "%s", template_dir);
    sb->L = lua_newstate(sandbox_alloc, sb);
    if (!sb->L) {
        free(sb);
        return NULL;
    }
    lua_State *L = sb->L;
    /* Only libraries without file or process access are opened. */
    luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
    luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
    luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
    luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
    luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
    lua_settop(L, 0);
    /* Strings share one metatable whose __index is the string library the
     * prelude uses; hide it so templates cannot rewrite string.format. */
    lua_pushliteral(L, "");
    lua_getmetatable(L, -1);
    lua_pushboolean(L, 0);
    lua_setfield(L, -2, "__metatable");
    lua_settop(L, 0);
    /* The prelude itself runs with these globals, so remove loaders too. */
    static const char *const unsafe[] = {"dofile", "loadfile", "load",
                                         "collectgarbage", "print", NULL};
    for (const char *const *u = unsafe; *u; u++) {
        lua_pushnil(L);
        lua_setglobal(L, *u);
    }
    build_env(sb);
    lua_newtable(L);
    sb->loaded_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_sethook(L, sandbox_hook, LUA_MASKCOUNT, SANDBOX_HOOK_STEP);
    return sb;
}

void sandbox_free(sandbox *sb)
{
    if (!sb)
        return;
    lua_close(sb->L);
    for (size_t i = 0; i < sb->nfiles; i++)
        free(sb->files[i]);
    free(sb->files);
    free(sb);
}

size_t sandbox_file_count(const sandbox *sb) { return sb->nfiles; }
const char *sandbox_file(const sandbox *sb, size_t i) { return i < sb->nfiles ? sb->files[i] : NULL; }

lua_State *sandbox_state(sandbox *sb) { return sb->L; }

void sandbox_push_env(sandbox *sb)
{
    lua_rawgeti(sb->L, LUA_REGISTRYINDEX, sb->env_ref);
}

static void take_error(lua_State *L, char *msg, size_t len)
{
    const char *m = lua_tostring(L, -1);
    snprintf(msg, len, "%s", m ? m : "template raised a non-string error");
    lua_pop(L, 1);
}

int sandbox_call(sandbox *sb, int nargs, int nresults, char *msg, size_t len)
{
    sb->instructions = 0;
    int rc = lua_pcall(sb->L, nargs, nresults, 0);
    if (rc != LUA_OK)
        take_error(sb->L, msg, len);
    return rc;
}

int sandbox_run_file(sandbox *sb, const char *name, char *msg, size_t len)
{
    if (load_template_chunk(sb, name)) {
        take_error(sb->L, msg, len);
        return 1;
    }
    return sandbox_call(sb, 0, 1, msg, len);
}
