/*
 * test_gen.c - unit tests of the kernel generator (gen/argen.h) and its Lua
 * sandbox (gen/sandbox.c).
 *
 * Throwaway templates are written into a fresh mkdtemp directory laid out
 * like templates/ (cpu/x.lua, lib/y.lua) and removed at the end. The real
 * templates are read from TEMPLATE_DIR, an absolute path the build passes in,
 * so the test does not depend on the working directory or the environment.
 */
#define _GNU_SOURCE /* nftw, FTW_PHYS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "argen.h"
#include "check.h"
#include "test_files.h"
#include "test_scratch.h"

#ifndef TEMPLATE_DIR
#error "TEMPLATE_DIR must name the project's templates/ directory"
#endif

static char tmpdir[512];

/* Writes text to <tmpdir>/<rel>; returns 0 on success. */
static int write_text(const char *rel, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", tmpdir, rel);
    return file_write(path, text, strlen(text));
}

/* Writes `text` as templates/cpu/x.lua in the temp dir and opens it. */
static int open_x(const char *text, argen **g, char *msg, size_t msg_len)
{
    *g = NULL;
    if (write_text("cpu/x.lua", text) != 0) {
        snprintf(msg, msg_len, "cannot write cpu/x.lua");
        return -1;
    }
    return argen_open(tmpdir, "cpu/x", g, msg, msg_len);
}

static const char *const lib_y =
    "-- lib/y.lua: a helper module for the test templates.\n"
    "return { answer = 42, name = 'y' }\n";

/* A small family: 2 x 3 x 2 = 12 combinations, of which the constraint
 * removes bf16 with vec 8 (2), leaving 10. */
static const char *const x_enumerate =
    "local y = require('lib/y')\n"
    "local T = {\n"
    "  backend = 'cpu',\n"
    "  op = 'mix',\n"
    "  params = {\n"
    "    { name = 'dtype', values = { 'f32', 'bf16' } },\n"
    "    { name = 'vec', values = { 1, 4, 8 } },\n"
    "    { name = 'tag', values = { 'a', 'b' } },\n"
    "  },\n"
    "  generic = { vec = 4, tag = 'a' },\n"
    "}\n"
    "function T.constraint(p) return not (p.dtype == 'bf16' and p.vec == 8) end\n"
    "function T.id(p) return string.format('x_%s_v%d_%s', p.dtype, p.vec, p.tag) end\n"
    "function T.launch(p) return { lanes = p.vec * 2 } end\n"
    "function T.emit(p)\n"
    "  local name = 'k_' .. T.id(p)\n"
    "  return gen.subst('int ${NAME}(void) { return ${VEC} + ${ANSWER}; }\\n',\n"
    "                   { NAME = name, VEC = p.vec, ANSWER = y.answer }), name\n"
    "end\n"
    "return T\n";

/* ------------------------------------------------------------------------
 * Enumeration, ids, params JSON and emission
 * ---------------------------------------------------------------------- */

static void test_enumerate_cartesian_product_under_constraint_in_stable_order(void)
{
    static const char *const want_ids[] = {
        "x_f32_v1_a", "x_f32_v1_b", "x_f32_v4_a", "x_f32_v4_b", "x_f32_v8_a",
        "x_f32_v8_b", "x_bf16_v1_a", "x_bf16_v1_b", "x_bf16_v4_a", "x_bf16_v4_b"};
    const size_t want_n = sizeof want_ids / sizeof want_ids[0];
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_enumerate, &g, msg, sizeof msg) == 0);
    CHECK(strcmp(argen_name(g), "cpu/x") == 0);
    CHECK(strcmp(argen_backend(g), "cpu") == 0);
    CHECK(strcmp(argen_op(g), "mix") == 0);

    argen_variant *v = NULL, *again = NULL;
    size_t n = 0, n_again = 0;
    CHECK(argen_enumerate(g, &v, &n) == 0);
    CHECK(n == want_n);
    for (size_t i = 0; i < n && i < want_n; i++) {
        if (strcmp(v[i].id, want_ids[i]) != 0) {
            fprintf(stderr, "variant %zu: got %s, want %s\n", i, v[i].id, want_ids[i]);
            CHECK(strcmp(v[i].id, want_ids[i]) == 0);
        }
    }
    /* Parameters plus launch data, keys sorted, integers without decimals. */
    if (n == want_n) {
        CHECK(strcmp(v[0].params_json, "{\"dtype\":\"f32\",\"lanes\":2,\"tag\":\"a\",\"vec\":1}") == 0);
        CHECK(strcmp(v[9].params_json, "{\"dtype\":\"bf16\",\"lanes\":8,\"tag\":\"b\",\"vec\":4}") == 0);
    }
    /* The same order on a second call and on a second handle. */
    CHECK(argen_enumerate(g, &again, &n_again) == 0);
    CHECK(n_again == n);
    for (size_t i = 0; i < n && i < n_again; i++) {
        CHECK(strcmp(v[i].id, again[i].id) == 0);
        CHECK(strcmp(v[i].params_json, again[i].params_json) == 0);
    }
    argen_variants_free(again, n_again);
    argen *g2 = NULL;
    CHECK(argen_open(tmpdir, "cpu/x", &g2, msg, sizeof msg) == 0);
    if (g2) {
        CHECK(argen_enumerate(g2, &again, &n_again) == 0);
        CHECK(n_again == n);
        for (size_t i = 0; i < n && i < n_again; i++)
            CHECK(strcmp(v[i].id, again[i].id) == 0);
        argen_variants_free(again, n_again);
    }
    argen_close(g2);
    argen_variants_free(v, n);
    argen_close(g);
}

static void test_emit_starts_with_generator_header_naming_file_variant_params(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_enumerate, &g, msg, sizeof msg) == 0);
    char *src = NULL, *kernel = NULL, *json = NULL;
    REQUIRE(argen_emit(g, "x_bf16_v4_b", &src, &kernel, &json) == 0);
    const char *want_header =
        "/* Generated by attnres-gen " ARGEN_VERSION " from templates/cpu/x.lua. Do not edit.\n"
        " * variant x_bf16_v4_b: dtype=bf16 vec=4 tag=b */\n";
    CHECK(strncmp(src, want_header, strlen(want_header)) == 0);
    if (strncmp(src, want_header, strlen(want_header)) != 0)
        fprintf(stderr, "emitted:\n%s\n", src);
    CHECK(strcmp(src + strlen(want_header), "int k_x_bf16_v4_b(void) { return 4 + 42; }\n") == 0);
    CHECK(strcmp(kernel, "k_x_bf16_v4_b") == 0);
    CHECK(strcmp(json, "{\"dtype\":\"bf16\",\"lanes\":8,\"tag\":\"b\",\"vec\":4}") == 0);
    free(src);
    free(kernel);
    free(json);

    /* params_json may be NULL when the caller does not want it. */
    CHECK(argen_emit(g, "x_f32_v8_a", &src, &kernel, NULL) == 0);
    CHECK(src && strstr(src, "variant x_f32_v8_a: dtype=f32 vec=8 tag=a") != NULL);
    free(src);
    free(kernel);

    /* A variant the constraint removed does not exist. */
    CHECK(argen_emit(g, "x_bf16_v8_a", &src, &kernel, &json) != 0);
    CHECK(src == NULL && kernel == NULL && json == NULL);
    CHECK(strstr(argen_errmsg(g), "x_bf16_v8_a") != NULL);

    /* The generic variant is the one T.generic names, for the dtype. */
    char *id = NULL;
    CHECK(argen_generic(g, "bf16", &id) == 0);
    CHECK(id && strcmp(id, "x_bf16_v4_a") == 0);
    free(id);
    id = NULL;
    CHECK(argen_generic(g, "f64", &id) != 0);
    CHECK(id == NULL);
    CHECK(strstr(argen_errmsg(g), "templates/cpu/x.lua") != NULL);

    /* Without T.applies every variant applies. */
    argen_problem prob = {.op = "mix", .dtype = "f32", .form = "replace", .d = 64, .t = 1, .n = 3, .heads = 1};
    argen_device dev = {.backend = "cpu", .arch = "x86_64", .units = 2};
    char why[256] = "x";
    CHECK(argen_applies(g, "x_f32_v1_a", &prob, &dev, why, sizeof why) == 1);
    CHECK(argen_applies(g, "no_such_variant", &prob, &dev, why, sizeof why) < 0);
    CHECK(strstr(why, "no_such_variant") != NULL);
    /* Without T.prune nothing is pruned. */
    CHECK(argen_prune(g, "x_f32_v1_a", &prob, &dev, why, sizeof why) == 0 && why[0] == 0);
    CHECK(argen_prune(g, "no_such_variant", &prob, &dev, why, sizeof why) < 0);
    argen_close(g);
}

/* The fused mix prunes what applies but was measured not to win: bursts on
 * head slices under 512 elements, prefetches from the mix for launches
 * under 64 MiB; the same variants are tuned where those hold. */
static void test_fused_mix_prunes_with_reasons(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/mix_fused", &g, msg, sizeof msg) == 0);
    argen_device dev = {.backend = "cpu", .arch = "x86_64-avx512", .units = 2};
    argen_problem small = {.op = "mix", .dtype = "bf16", .form = "replace", .d = 256, .t = 64, .n = 9, .heads = 1};
    argen_problem big = {.op = "mix", .dtype = "bf16", .form = "replace", .d = 7168, .t = 4096, .n = 9, .heads = 1};
    char why[256];
    const char *burst = "mix_c_bf16_fused_v16_g8_b4_pn_dfma_sc_t2", *all = "mix_c_bf16_fused_v16_g8_pa_dfma_sc_t2";
    const char *plain = "mix_c_bf16_fused_v16_g8_pn_dfma_sc_t2";
    CHECK(argen_applies(g, burst, &small, &dev, why, sizeof why) == 1);
    CHECK(argen_prune(g, burst, &small, &dev, why, sizeof why) == 1 && strstr(why, "head slices of 512"));
    CHECK(argen_prune(g, burst, &big, &dev, why, sizeof why) == 0);
    CHECK(argen_prune(g, all, &small, &dev, why, sizeof why) == 1 && strstr(why, "64 MiB"));
    CHECK(argen_prune(g, all, &big, &dev, why, sizeof why) == 0);
    CHECK(argen_prune(g, plain, &small, &dev, why, sizeof why) == 0 && why[0] == 0);
    argen_close(g);
}

static void test_specialize_fixes_facts_the_source_and_its_header_name(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x("return { backend = 'cpu', op = 'mix', params = { { name = 'v', values = { 1 } } },\n"
                   "  id = function(p) return 'x_' .. p.v end,\n"
                   "  specialize = function(p, problem) if problem.n > 1 then return { n = problem.n, v = p.v } end end,\n"
                   "  emit = function(p, facts)\n"
                   "    return 'int k(void) { return ' .. (facts and facts.n or 0) .. '; }\\n', 'k' end }\n",
                   &g, msg, sizeof msg) == 0);
    argen_device dev = {.backend = "cpu", .arch = "x86_64", .units = 2};
    argen_problem p9 = {.op = "mix", .dtype = "f32", .form = "replace", .d = 64, .t = 1, .n = 9, .heads = 1};
    argen_problem p1 = p9;
    p1.n = 1;
    char spec[64];
    /* Facts in name order; none when specialize returns nil. */
    CHECK(argen_specialize(g, "x_1", &p9, &dev, spec, sizeof spec) == 0 && strcmp(spec, "n=9,v=1") == 0);
    CHECK(argen_specialize(g, "x_1", &p1, &dev, spec, sizeof spec) == 0 && strcmp(spec, "") == 0);
    char *src = NULL, *kernel = NULL;
    REQUIRE(argen_emit_for(g, "x_1", "n=9,v=1", &src, &kernel, NULL) == 0);
    CHECK(strstr(src, "specialized for n=9,v=1") && strstr(src, "return 9;"));
    free(src);
    free(kernel);
    REQUIRE(argen_emit(g, "x_1", &src, &kernel, NULL) == 0);
    CHECK(!strstr(src, "specialized") && strstr(src, "return 0;"));
    free(src);
    free(kernel);
    argen_close(g);
    /* Anything but names to integers is the template's error, said. */
    REQUIRE(open_x("return { backend = 'cpu', op = 'mix', params = { { name = 'v', values = { 1 } } },\n"
                   "  id = function(p) return 'x_' .. p.v end,\n"
                   "  specialize = function(p, problem) return { n = 'nine' } end,\n"
                   "  emit = function(p) return '', 'k' end }\n",
                   &g, msg, sizeof msg) == 0);
    CHECK(argen_specialize(g, "x_1", &p9, &dev, spec, sizeof spec) < 0 && strstr(spec, "names to integers"));
    argen_close(g);
}

static void test_list_templates_finds_dialect_templates_only(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_enumerate, &g, msg, sizeof msg) == 0);
    argen_close(g);
    char **names = NULL;
    size_t n = 0;
    REQUIRE(argen_list_templates(tmpdir, &names, &n) == 0);
    CHECK(n == 1);
    if (n >= 1)
        CHECK(strcmp(names[0], "cpu/x") == 0);
    argen_names_free(names, n);
}

/* ------------------------------------------------------------------------
 * Errors carry file:line
 * ---------------------------------------------------------------------- */

static void test_subst_unknown_key_reports_template_file_and_line(void)
{
    /* The gen.subst call is on line 7. */
    static const char *const text =
        "local T = { backend = 'cpu', op = 'mix',\n"          /* 1 */
        "  params = { { name = 'a', values = { 1 } } } }\n"   /* 2 */
        "function T.id(p) return 'x_' .. p.a end\n"           /* 3 */
        "function T.emit(p)\n"                                /* 4 */
        "  local name = 'k'\n"                                /* 5 */
        "  local body =\n"                                    /* 6 */
        "    gen.subst('${NAME} ${MISSING_KEY}', { NAME = name })\n" /* 7 */
        "  return body, name\n"                               /* 8 */
        "end\n"                                               /* 9 */
        "return T\n";
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(text, &g, msg, sizeof msg) == 0);
    char *src = NULL, *kernel = NULL, *json = NULL;
    CHECK(argen_emit(g, "x_1", &src, &kernel, &json) != 0);
    const char *err = argen_errmsg(g);
    CHECK(strstr(err, "MISSING_KEY") != NULL);
    CHECK(strstr(err, "templates/cpu/x.lua:7:") != NULL);
    if (!strstr(err, "templates/cpu/x.lua:7:"))
        fprintf(stderr, "  subst error was: %s\n", err);
    CHECK(src == NULL && kernel == NULL);
    argen_close(g);
}

static void test_syntax_error_reports_template_file_and_line(void)
{
    static const char *const text =
        "local T = {}\n"
        "local broken = = 2\n"
        "return T\n";
    char msg[1024] = "";
    argen *g = (argen *)&msg; /* must be reset to NULL */
    CHECK(open_x(text, &g, msg, sizeof msg) != 0);
    CHECK(g == NULL);
    CHECK(strncmp(msg, "templates/cpu/x.lua:2:", strlen("templates/cpu/x.lua:2:")) == 0);
    if (strncmp(msg, "templates/cpu/x.lua:2:", strlen("templates/cpu/x.lua:2:")) != 0)
        fprintf(stderr, "  syntax error was: %s\n", msg);
}

static void test_runtime_error_and_bad_shape_at_load_are_reported(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    CHECK(open_x("local x = 1\nerror('boom at load')\nreturn {}\n", &g, msg, sizeof msg) != 0);
    CHECK(g == NULL);
    CHECK(strstr(msg, "templates/cpu/x.lua:2:") != NULL);
    CHECK(strstr(msg, "boom at load") != NULL);

    /* A table without emit is refused by validation, naming the field. */
    CHECK(open_x("return { backend = 'cpu', op = 'mix', params = {}, id = function() return 'a' end }\n", &g,
                 msg, sizeof msg) != 0);
    CHECK(g == NULL);
    CHECK(strstr(msg, "templates/cpu/x.lua") != NULL);
    CHECK(strstr(msg, "emit") != NULL);

    /* A template that does not exist. */
    CHECK(argen_open(tmpdir, "cpu/does_not_exist", &g, msg, sizeof msg) != 0);
    CHECK(g == NULL);
    CHECK(strstr(msg, "does_not_exist") != NULL);
}

/* ------------------------------------------------------------------------
 * The sandbox
 * ---------------------------------------------------------------------- */

/* One variant per behaviour: emit(m_<mode>) does <mode>. */
static const char *const x_modes =
    "local y = require('lib/y')\n"
    "local T = { backend = 'cpu', op = 'mix', params = { { name = 'mode', values = {\n"
    "  'ok', 'globals', 'loop', 'bomb', 'dotdot', 'abs', 'missing', 'lib', 'nonstring' } } } }\n"
    "function T.id(p) return 'm_' .. p.mode end\n"
    "local act = {}\n"
    "function act.ok() return 'ok ' .. y.answer end\n"
    "function act.globals()\n"
    "  return string.format('io=%s os=%s load=%s loadfile=%s dofile=%s print=%s '\n"
    "    .. 'collectgarbage=%s debug=%s package=%s G.io=%s string.format=%s',\n"
    "    type(io), type(os), type(load), type(loadfile), type(dofile), type(print),\n"
    "    type(collectgarbage), type(debug), type(package), type(_G.io), type(string.format))\n"
    "end\n"
    "function act.loop() local i = 0 while true do i = i + 1 end end\n"
    "function act.bomb()\n"
    "  local s = 'abcdefghijklmnop'\n"
    "  for i = 1, 64 do s = string.rep(s, 2) end\n"
    "  return s\n"
    "end\n"
    "function act.dotdot() return require('../etc/passwd') end\n"
    "function act.abs() return require('/abs') end\n"
    "function act.missing() return require('lib/nope') end\n"
    "function act.lib() local m = require('lib/y') return m.name .. ' ' .. tostring(m == y) end\n"
    "function act.nonstring() error({}) end\n"
    "function T.emit(p) return act[p.mode](), 'k_' .. p.mode end\n"
    "return T\n";

/* Emits m_<mode>; returns argen_emit's status and (on success) the source
 * without the header, in buf. */
static int emit_mode(argen *g, const char *mode, char *buf, size_t len)
{
    char id[64];
    snprintf(id, sizeof id, "m_%s", mode);
    char *src = NULL, *kernel = NULL, *json = NULL;
    int rc = argen_emit(g, id, &src, &kernel, &json);
    buf[0] = 0;
    if (rc == 0) {
        const char *body = strstr(src, "*/\n");
        snprintf(buf, len, "%s", body ? body + 3 : src);
    }
    free(src);
    free(kernel);
    free(json);
    return rc;
}

/* After an error the same handle must still enumerate and emit. */
static void check_handle_still_works(argen *g)
{
    argen_variant *v = NULL;
    size_t n = 0;
    CHECK(argen_enumerate(g, &v, &n) == 0);
    CHECK(n == 9);
    argen_variants_free(v, n);
    char buf[256];
    CHECK(emit_mode(g, "ok", buf, sizeof buf) == 0);
    CHECK(strcmp(buf, "ok 42") == 0);
}

/* The template's mode `mode` is refused with a message that holds n1 and
 * n2 (those not NULL; with both NULL, any message), and the handle still
 * works after it. */
static void check_refused(argen *g, const char *mode, const char *n1, const char *n2)
{
    char buf[256];
    CHECK(emit_mode(g, mode, buf, sizeof buf) != 0);
    const char *msg = argen_errmsg(g);
    if (!msg[0] || (n1 && !strstr(msg, n1)) || (n2 && !strstr(msg, n2))) {
        fprintf(stderr, "  %s: refused with '%s'\n", mode, msg);
        check_failures++;
    }
    check_handle_still_works(g);
}

static void test_sandbox_hides_io_os_and_loaders(void)
{
    char msg[1024] = "", buf[1024];
    argen *g = NULL;
    REQUIRE(open_x(x_modes, &g, msg, sizeof msg) == 0);
    CHECK(emit_mode(g, "globals", buf, sizeof buf) == 0);
    CHECK(strcmp(buf, "io=nil os=nil load=nil loadfile=nil dofile=nil print=nil collectgarbage=nil "
                      "debug=nil package=nil G.io=nil string.format=function") == 0);
    if (strcmp(buf, "io=nil os=nil load=nil loadfile=nil dofile=nil print=nil collectgarbage=nil "
                    "debug=nil package=nil G.io=nil string.format=function") != 0)
        fprintf(stderr, "  globals: %s\n", buf);
    argen_close(g);
}

static void test_require_refuses_paths_outside_templates(void)
{
    char msg[1024] = "", buf[256];
    argen *g = NULL;
    REQUIRE(open_x(x_modes, &g, msg, sizeof msg) == 0);

    check_refused(g, "dotdot", "../etc/passwd", "invalid template name");
    check_refused(g, "abs", "/abs", "invalid template name");
    check_refused(g, "missing", "lib/nope", NULL);

    /* require of a template under templates/ works and is loaded once. */
    CHECK(emit_mode(g, "lib", buf, sizeof buf) == 0);
    CHECK(strcmp(buf, "y true") == 0);
    argen_close(g);
}

static void test_infinite_loop_stops_with_instruction_budget_error(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_modes, &g, msg, sizeof msg) == 0);
    time_t t0 = time(NULL);
    /* The budget is per call: the handle's next call is not charged for
     * the loop. */
    check_refused(g, "loop", "instruction budget", "templates/cpu/x.lua");
    fprintf(stderr, "  (loop stopped after about %ld s)\n", (long)(time(NULL) - t0));
    argen_close(g);
}

static void test_memory_bomb_stops_with_not_enough_memory(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_modes, &g, msg, sizeof msg) == 0);
    check_refused(g, "bomb", "not enough memory", NULL);
    /* Memory is given back: the bomb fails the same way a second time. */
    check_refused(g, "bomb", "not enough memory", NULL);
    argen_close(g);
}

static void test_non_string_error_is_reported_not_crashed(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_modes, &g, msg, sizeof msg) == 0);
    check_refused(g, "nonstring", NULL, NULL);
    argen_close(g);
}

/* ------------------------------------------------------------------------
 * The real templates
 * ---------------------------------------------------------------------- */

static const argen_variant *find_variant(const argen_variant *v, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].id, id) == 0)
            return &v[i];
    return NULL;
}

static void test_real_cpu_mix_enumerates_and_every_f32_variant_emits(void)
{
    char msg[1024] = "";
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/mix", &g, msg, sizeof msg) == 0);
    CHECK(strcmp(argen_backend(g), "cpu") == 0);
    CHECK(strcmp(argen_op(g), "mix") == 0);
    argen_variant *v = NULL;
    size_t n = 0;
    REQUIRE(argen_enumerate(g, &v, &n) == 0);
    CHECK(n > 0);
    /* Ids are unique. */
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (strcmp(v[i].id, v[j].id) == 0) {
                fprintf(stderr, "  duplicate id %s\n", v[i].id);
                CHECK(0);
            }
    size_t emitted = 0;
    for (size_t i = 0; i < n; i++) {
        if (!strstr(v[i].params_json, "\"dtype\":\"f32\""))
            continue;
        char *src = NULL, *kernel = NULL, *json = NULL;
        int rc = argen_emit(g, v[i].id, &src, &kernel, &json);
        if (rc != 0) {
            fprintf(stderr, "  emit %s failed: %s\n", v[i].id, argen_errmsg(g));
            CHECK(rc == 0);
            continue;
        }
        emitted++;
        CHECK(strncmp(src, "/* Generated by attnres-gen", 27) == 0);
        CHECK(strstr(src, "templates/cpu/mix.lua") != NULL);
        /* The header names the kernel, not the variant: the id names the
         * thread count, which the source must not depend on. */
        char kernel_line[300];
        snprintf(kernel_line, sizeof kernel_line, " * kernel %s: dtype=f32 ", kernel);
        CHECK(strstr(src, kernel_line) != NULL);
        CHECK(kernel[0] != 0 && strstr(src, kernel) != NULL);
        CHECK(strcmp(json, v[i].params_json) == 0);
        free(src);
        free(kernel);
        free(json);
    }
    CHECK(emitted > 0);

    char *id = NULL;
    CHECK(argen_generic(g, "bf16", &id) == 0);
    CHECK(id && find_variant(v, n, id) != NULL);
    if (id && !find_variant(v, n, id))
        fprintf(stderr, "  generic bf16 id %s is not enumerated\n", id);
    free(id);
    id = NULL;
    CHECK(argen_generic(g, "f32", &id) == 0);
    CHECK(id && find_variant(v, n, id) != NULL);

    /* applies: the generic variant fits an odd shape on a one-core device,
     * a 16-lane variant does not fit d = 8, and needs AVX-512 on x86-64. */
    argen_problem prob = {.op = "mix", .dtype = "f32", .form = "replace", .d = 7, .t = 1, .n = 3, .heads = 1};
    argen_device dev = {.backend = "cpu", .arch = "x86_64", .units = 1};
    char why[256];
    if (id)
        CHECK(argen_applies(g, id, &prob, &dev, why, sizeof why) == 1);
    free(id);
    const argen_variant *wide = NULL;
    for (size_t i = 0; i < n && !wide; i++)
        if (strstr(v[i].params_json, "\"dtype\":\"f32\"") && strstr(v[i].params_json, "\"vec\":16"))
            wide = &v[i];
    CHECK(wide != NULL);
    if (wide) {
        argen_device avx512 = {.backend = "cpu", .arch = "x86_64-avx512", .units = 64};
        argen_device avx2 = {.backend = "cpu", .arch = "x86_64-avx2", .units = 64};
        argen_device arm = {.backend = "cpu", .arch = "aarch64", .units = 64};
        prob.d = 64;
        CHECK(argen_applies(g, wide->id, &prob, &avx512, why, sizeof why) == 1);
        CHECK(argen_applies(g, wide->id, &prob, &arm, why, sizeof why) == 1);
        why[0] = 0;
        CHECK(argen_applies(g, wide->id, &prob, &avx2, why, sizeof why) == 0);
        CHECK(strstr(why, "AVX-512") != NULL);
        CHECK(argen_applies(g, wide->id, &prob, &dev, why, sizeof why) == 0);
        prob.d = 8;
        why[0] = 0;
        CHECK(argen_applies(g, wide->id, &prob, &avx512, why, sizeof why) == 0);
        CHECK(strstr(why, "multiple") != NULL);
    }

    argen_variants_free(v, n);
    argen_close(g);

    char **names = NULL;
    size_t nn = 0;
    CHECK(argen_list_templates(TEMPLATE_DIR, &names, &nn) == 0);
    int has_mix = 0;
    for (size_t i = 0; i < nn; i++)
        has_mix |= strcmp(names[i], "cpu/mix") == 0;
    CHECK(has_mix);
    argen_names_free(names, nn);
}

/* A template whose `threads` is a launch parameter: the source, the kernel
 * name and the header must not depend on it. */
static const char *const x_launch =
    "local T = {\n"
    "  backend = 'cpu',\n"
    "  op = 'mix',\n"
    "  params = {\n"
    "    { name = 'dtype', values = { 'f32' } },\n"
    "    { name = 'threads', values = { 1, 2 }, launch = true },\n"
    "  },\n"
    "}\n"
    "function T.id(p) return string.format('x_%s_t%d', p.dtype, p.threads) end\n"
    "function T.emit(p) return 'int k_x_' .. p.dtype .. ';\\n', 'k_x_' .. p.dtype end\n"
    "return T\n";

/* params_json without its "threads" entry, into out. */
static void json_without_threads(const char *json, char *out, size_t len)
{
    snprintf(out, len, "%s", json);
    char *at = strstr(out, "\"threads\":");
    if (!at)
        return;
    char *end = at + strcspn(at, ",}");
    if (*end == ',')
        end++;                  /* "threads" first or in the middle */
    else if (at > out + 1)
        at--;                   /* "threads" last: drop the comma before it */
    memmove(at, end, strlen(end) + 1);
}

/* Emits variant id of g; 0 on success, with *src and *kernel to free. */
static int emit_variant(argen *g, const char *id, char **src, char **kernel)
{
    char *json = NULL;
    int rc = argen_emit(g, id, src, kernel, &json);
    if (rc != 0)
        fprintf(stderr, "  emit %s failed: %s\n", id, argen_errmsg(g));
    free(json);
    return rc;
}

/* The thread count of a CPU kernel is a launch parameter: the variants that
 * differ only in it keep their own ids (the database names the thread
 * count it measured) but emit one source with one kernel name, so that
 * they share a build key and the tuner compiles them once. Checked on
 * variants spread over each CPU template's space. */
static void test_cpu_variants_differing_only_in_threads_emit_one_source(void)
{
    char msg[2048] = "";
    argen *g = NULL;
    REQUIRE(open_x(x_launch, &g, msg, sizeof msg) == 0);
    char *a = NULL, *b = NULL, *ka = NULL, *kb = NULL;
    REQUIRE(emit_variant(g, "x_f32_t1", &a, &ka) == 0);
    REQUIRE(emit_variant(g, "x_f32_t2", &b, &kb) == 0);
    const char *want = "/* Generated by attnres-gen " ARGEN_VERSION " from templates/cpu/x.lua. Do not edit.\n"
                       " * kernel k_x_f32: dtype=f32 (threads: set at launch) */\n"
                       "int k_x_f32;\n";
    CHECK(strcmp(a, want) == 0);
    if (strcmp(a, want) != 0)
        fprintf(stderr, "emitted:\n%s\n", a);
    CHECK(strcmp(a, b) == 0 && strcmp(ka, kb) == 0);
    free(a), free(b), free(ka), free(kb);
    argen_close(g);
    /* `launch` is a flag. */
    char bad[1024];
    snprintf(bad, sizeof bad, "%s", x_launch);
    char *flag = strstr(bad, "launch = true");
    REQUIRE(flag != NULL);
    memcpy(flag, "launch = 1   ", 13);
    CHECK(open_x(bad, &g, msg, sizeof msg) != 0);
    CHECK(strstr(msg, "launch must be") != NULL);

    static const char *const templates[] = {"cpu/mix", "cpu/mix_fused", "cpu/phase1", "cpu/phase2"};
    for (size_t t = 0; t < sizeof templates / sizeof templates[0]; t++) {
        REQUIRE(argen_open(TEMPLATE_DIR, templates[t], &g, msg, sizeof msg) == 0);
        argen_variant *v = NULL;
        size_t n = 0;
        REQUIRE(argen_enumerate(g, &v, &n) == 0);
        /* About six single-thread variants per template, spread over its
         * space, each against every variant that differs only in threads. */
        size_t checked = 0, next = 0;
        for (size_t i = 0; i < n; i++) {
            const size_t idlen = strlen(v[i].id);
            if (i < next || idlen < 3 || strcmp(v[i].id + idlen - 3, "_t1") != 0)
                continue;
            next = i + n / 6;
            char *src = NULL, *kernel = NULL;
            if (emit_variant(g, v[i].id, &src, &kernel) != 0) {
                CHECK(0);
                continue;
            }
            /* Named after the id without its thread count; neither the id
             * nor the thread count's symbol appears in the source. */
            CHECK(strncmp(kernel, "attnres_", 8) == 0 && strlen(kernel) == 8 + idlen - 3 &&
                  strncmp(kernel + 8, v[i].id, idlen - 3) == 0);
            CHECK(strstr(src, v[i].id) == NULL);
            CHECK(strstr(src, "_threads") == NULL);
            char base[1024], other[1024];
            json_without_threads(v[i].params_json, base, sizeof base);
            int siblings = 0;
            for (size_t j = 0; j < n; j++) {
                if (j == i)
                    continue;
                json_without_threads(v[j].params_json, other, sizeof other);
                if (strcmp(base, other) != 0)
                    continue;
                siblings++;
                CHECK(strcmp(v[i].id, v[j].id) != 0);
                CHECK(strcmp(v[i].params_json, v[j].params_json) != 0);
                char *src2 = NULL, *kernel2 = NULL;
                if (emit_variant(g, v[j].id, &src2, &kernel2) != 0) {
                    CHECK(0);
                    continue;
                }
                if (strcmp(src, src2) != 0 || strcmp(kernel, kernel2) != 0) {
                    fprintf(stderr, "  %s and %s emit different sources or kernel names (%s, %s)\n", v[i].id,
                            v[j].id, kernel, kernel2);
                    CHECK(0);
                }
                free(src2);
                free(kernel2);
            }
            /* Threads 2, 4, ... 64: the constraints never depend on them. */
            CHECK(siblings == 6);
            if (siblings != 6)
                fprintf(stderr, "  %s has %d variants that differ only in threads\n", v[i].id, siblings);
            checked++;
            free(src);
            free(kernel);
        }
        CHECK(checked >= 5);
        argen_variants_free(v, n);
        argen_close(g);
    }
}

/* The first variant of template `name` emitted, or NULL (freed by the caller). */
static char *emit_first(const char *name)
{
    char msg[1024] = "";
    argen *g = NULL;
    if (argen_open(TEMPLATE_DIR, name, &g, msg, sizeof msg) != 0)
        return NULL;
    argen_variant *v = NULL;
    size_t n = 0;
    char *src = NULL, *kernel = NULL, *json = NULL;
    if (argen_enumerate(g, &v, &n) == 0 && n > 0 && argen_emit(g, v[0].id, &src, &kernel, &json) != 0)
        src = NULL;
    free(kernel);
    free(json);
    argen_variants_free(v, n);
    argen_close(g);
    return src;
}

/* Phase 1 is compiled scheduled for a generic x86-64 (cpu/phase1.lua says
 * why), from before the first line any function could come from; the mix
 * keeps the CPU's own tuning. */
static void test_phase1_asks_for_generic_tuning_and_the_mix_does_not(void)
{
    const char *pragma = "#pragma GCC target(\"tune=generic\")";
    char *p1 = emit_first("cpu/phase1"), *mix = emit_first("cpu/mix_fused");
    REQUIRE(p1 && mix);
    const char *at = strstr(p1, pragma), *include = strstr(p1, "#include");
    CHECK(at && include && at < include);
    CHECK(strstr(mix, "tune=") == NULL);
    free(p1);
    free(mix);
}

/* Whether path is among the files g read. */
static int read_file_named(const argen *g, const char *tail)
{
    for (size_t i = 0; i < argen_file_count(g); i++) {
        const char *f = argen_file(g, i);
        size_t n = strlen(f), t = strlen(tail);
        if (n >= t && strcmp(f + n - t, tail) == 0)
            return 1;
    }
    return 0;
}

/* The build's depfiles list what argen_file reports, so every file a
 * template requires, directly or not, must be there, and nothing twice. */
static void test_files_read_name_every_required_template_once(void)
{
    char msg[2048];
    argen *g;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/phase2", &g, msg, sizeof msg) == 0);
    CHECK(read_file_named(g, "/cpu/phase2.lua"));
    CHECK(read_file_named(g, "/lib/c_prefetch.lua"));
    CHECK(read_file_named(g, "/lib/kernel_abi.lua"));
    CHECK(read_file_named(g, "/lib/c_storage.lua"));
    CHECK(!read_file_named(g, "/cpu/mix.lua"));
    for (size_t i = 0; i < argen_file_count(g); i++)
        for (size_t j = i + 1; j < argen_file_count(g); j++)
            CHECK(strcmp(argen_file(g, i), argen_file(g, j)) != 0);
    CHECK(argen_file(g, argen_file_count(g)) == NULL);
    argen_close(g);

    /* The ABI module renders the runtime's header from the same table. */
    REQUIRE(argen_open_module(TEMPLATE_DIR, "lib/kernel_abi", &g, msg, sizeof msg) == 0);
    char *text = NULL;
    REQUIRE(argen_module_text(g, "header", &text) == 0);
    CHECK(strstr(text, "#define AR_KERNEL_ABI_CPU_MIX ") != NULL);
    CHECK(strstr(text, "_Static_assert(sizeof(attnres_cuda_phase2_args) == 152") != NULL);
    free(text);
    CHECK(argen_module_text(g, "no_such_function", &text) != 0 && text == NULL);
    CHECK(strstr(argen_errmsg(g), "no_such_function") != NULL);
    argen_close(g);
}

/* Lays out the scratch template directory the cases write into: cpu/ for
 * their templates and lib/y.lua for them to require; 0 on success, else -1
 * with the reason printed. */
static int lay_out_templates(void)
{
    char sub[600];
    snprintf(sub, sizeof sub, "%s/cpu", tmpdir);
    int bad = mkdir(sub, 0700);
    snprintf(sub, sizeof sub, "%s/lib", tmpdir);
    bad |= mkdir(sub, 0700);
    bad |= write_text("lib/y.lua", lib_y);
    if (bad) {
        fprintf(stderr, "cannot lay out %s\n", tmpdir);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    scratch_begin("gen", tmpdir, sizeof tmpdir, check_listing, NULL);
    if (!check_listing && lay_out_templates() != 0)
        return 1;

    RUN_CASE(test_enumerate_cartesian_product_under_constraint_in_stable_order);
    RUN_CASE(test_emit_starts_with_generator_header_naming_file_variant_params);
    RUN_CASE(test_specialize_fixes_facts_the_source_and_its_header_name);
    RUN_CASE(test_list_templates_finds_dialect_templates_only);
    RUN_CASE(test_subst_unknown_key_reports_template_file_and_line);
    RUN_CASE(test_syntax_error_reports_template_file_and_line);
    RUN_CASE(test_runtime_error_and_bad_shape_at_load_are_reported);
    RUN_CASE(test_sandbox_hides_io_os_and_loaders);
    RUN_CASE(test_require_refuses_paths_outside_templates);
    RUN_CASE(test_infinite_loop_stops_with_instruction_budget_error);
    RUN_CASE(test_memory_bomb_stops_with_not_enough_memory);
    RUN_CASE(test_non_string_error_is_reported_not_crashed);
    RUN_CASE(test_real_cpu_mix_enumerates_and_every_f32_variant_emits);
    RUN_CASE(test_phase1_asks_for_generic_tuning_and_the_mix_does_not);
    RUN_CASE(test_fused_mix_prunes_with_reasons);
    RUN_CASE(test_cpu_variants_differing_only_in_threads_emit_one_source);
    RUN_CASE(test_files_read_name_every_required_template_once);

    CHECK_EXIT();
}
