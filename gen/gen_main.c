/*
 * gen_main.c - attnres-gen, the build-time generator.
 *
 *   attnres-gen TEMPLATE_DIR list TEMPLATE
 *   attnres-gen TEMPLATE_DIR emit TEMPLATE ID [OUT.c]
 *   attnres-gen TEMPLATE_DIR generic TEMPLATE DTYPE OUT.c [DEPFILE]
 *   attnres-gen TEMPLATE_DIR generic-source TEMPLATE DTYPE OUT.c SYMBOL [DEPFILE]
 *   attnres-gen TEMPLATE_DIR builtin TEMPLATE DTYPE LEVEL OUT.c [DEPFILE]
 *   attnres-gen TEMPLATE_DIR header MODULE OUT.h [DEPFILE]
 *
 * `builtin` emits the variant the template's T.builtin names for an ISA
 * level (avx512, avx2, sse2, neon), its symbols suffixed with _LEVEL so
 * that one library holds every level, and defines ar_builtin_<op>_<dtype>_
 * <level> (the entry; NULL when the template names none for the level),
 * ..._variant[] and ..._step (the head width must be a multiple of it).
 * The build compiles each with the level's compiler flags.
 *
 * `generic-source` embeds the generic variant's source text instead of
 * compiling it (CUDA: the runtime compiles it with NVRTC for the device it
 * opens). OUT.c defines const char SYMBOL[] (the source), SYMBOL_kernel[]
 * (the entry symbol), SYMBOL_params[] (params JSON with the launch data)
 * and SYMBOL_variant[] (the variant id).
 * The build uses `generic` to compile the runtime's fallback kernels from the
 * same templates the tuner uses, so the library needs no Lua at run time.
 * `header` writes what MODULE's header() returns: the build makes the
 * runtime's kernel_abi.h from lib/kernel_abi this way, so the runtime and
 * the kernels share one definition of each argument struct.
 * DEPFILE, when given, receives a Makefile rule naming every template file
 * the output came from (the template and each file it required), so that a
 * build regenerates the output when any of them changes.
 * Output files are written whole or not at all (temporary file + rename).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argen.h"

static int write_file(const char *path, const char *text)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fprintf(stderr, "attnres-gen: cannot write %s\n", tmp);
        return 1;
    }
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        fprintf(stderr, "attnres-gen: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* The text buffer below, declared early for the depfile writer. */
typedef struct strbuf strbuf;
static void sb_str(strbuf *b, const char *s);
static void sb_put(strbuf *b, const char *s, size_t n);

/* Appends path to b escaped for a Makefile rule: spaces and '#' take a
 * backslash, '$' doubles. */
static void sb_make_path(strbuf *b, const char *path)
{
    for (const char *c = path; *c; c++) {
        if (*c == ' ' || *c == '#')
            sb_put(b, "\\", 1);
        else if (*c == '$')
            sb_put(b, "$", 1);
        sb_put(b, c, 1);
    }
}

/* Writes "target: file..." for every template file g read. */
static int write_depfile(const argen *g, const char *depfile, const char *target);

/* Appends the names under which the runtime's table finds a generic
 * kernel: ar_generic_<op>_<dtype> and its variant id. */
static char *append_alias(char *src, const char *op, const char *dtype,
                          const char *id, const char *kernel)
{
    char alias[1024];
    int n = snprintf(alias, sizeof alias,
                     "\n/* Names the runtime's table of built-in kernels uses. */\n"
                     "const char ar_generic_%s_%s_variant[] = \"%s\";\n"
                     "void (*const ar_generic_%s_%s)(const struct attnres_cpu_%s_args *, int64_t, int64_t) = %s;\n",
                     op, dtype, id, op, dtype, op, kernel);
    size_t len = strlen(src);
    char *out = realloc(src, len + (size_t)n + 1);
    if (!out) {
        free(src);
        return NULL;
    }
    memcpy(out + len, alias, (size_t)n + 1);
    return out;
}

static int emit(argen *g, const char *id, const char *path, const char *generic_dtype)
{
    char *src, *kernel, *json;
    if (argen_emit(g, id, &src, &kernel, &json)) {
        fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
        return 1;
    }
    if (generic_dtype && !(src = append_alias(src, argen_op(g), generic_dtype, id, kernel))) {
        fprintf(stderr, "attnres-gen: out of memory\n");
        free(kernel);
        free(json);
        return 1;
    }
    int rc = 0;
    if (path)
        rc = write_file(path, src);
    else
        fputs(src, stdout);
    free(src);
    free(kernel);
    free(json);
    return rc;
}

/* Appends text to a malloc'ed buffer, growing it; NULL on failure. */
struct strbuf {
    char *p;
    size_t len, cap;
    int bad;
};

static void sb_put(strbuf *b, const char *s, size_t n)
{
    if (b->bad)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->bad = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(strbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* Writes `const char SYMBOL[] = "...";` with text as C string literals, one
 * source line per literal line. */
static void sb_c_string(strbuf *b, const char *symbol, const char *suffix, const char *text)
{
    sb_str(b, "const char ");
    sb_str(b, symbol);
    sb_str(b, suffix);
    sb_str(b, "[] =\n    \"");
    for (const char *s = text; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '\n') {
            sb_str(b, s[1] ? "\\n\"\n    \"" : "\\n");
        } else if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sb_put(b, esc, 2);
        } else if (c == '\t') {
            sb_str(b, "\\t");
        } else if (c < 32 || c >= 127) {
            snprintf(esc, sizeof esc, "\\%03o", c); /* octal: never swallows a following digit */
            sb_str(b, esc);
        } else if (c == '?') {
            sb_str(b, "\\?"); /* never a trigraph */
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\";\n");
}

static int write_depfile(const argen *g, const char *depfile, const char *target)
{
    if (!depfile)
        return 0;
    strbuf b = {0};
    sb_make_path(&b, target);
    sb_str(&b, ":");
    for (size_t i = 0; i < argen_file_count(g); i++) {
        sb_str(&b, " \\\n  ");
        sb_make_path(&b, argen_file(g, i));
    }
    sb_str(&b, "\n");
    int rc = 1;
    if (b.bad)
        fprintf(stderr, "attnres-gen: out of memory\n");
    else
        rc = write_file(depfile, b.p);
    free(b.p);
    return rc;
}

/* The text a helper module's header() returns, e.g. kernel_abi.h. */
static int module_header(const char *template_dir, const char *module, const char *path, const char *depfile)
{
    char msg[2048];
    argen *g;
    if (argen_open_module(template_dir, module, &g, msg, sizeof msg)) {
        fprintf(stderr, "attnres-gen: %s\n", msg);
        return 1;
    }
    char *text;
    int rc = argen_module_text(g, "header", &text);
    if (rc)
        fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
    else {
        rc = write_file(path, text);
        free(text);
    }
    if (!rc)
        rc = write_depfile(g, depfile, path);
    argen_close(g);
    return rc;
}

/* The generic variant of a template as embedded source text. */
static int generic_source(argen *g, const char *dtype, const char *path, const char *symbol)
{
    for (const char *c = symbol; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' ||
              (c != symbol && *c >= '0' && *c <= '9'))) {
            fprintf(stderr, "attnres-gen: '%s' is not a C identifier\n", symbol);
            return 1;
        }
    char *id, *src, *kernel, *json;
    if (argen_generic(g, dtype, &id)) {
        fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
        return 1;
    }
    if (argen_emit(g, id, &src, &kernel, &json)) {
        fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
        free(id);
        return 1;
    }
    strbuf b = {0};
    sb_str(&b, "/* Generated by attnres-gen from templates/");
    sb_str(&b, argen_name(g));
    sb_str(&b, ".lua (generic variant, ");
    sb_str(&b, dtype);
    sb_str(&b, "). Do not edit. */\n");
    sb_c_string(&b, symbol, "", src);
    sb_c_string(&b, symbol, "_kernel", kernel);
    sb_c_string(&b, symbol, "_params", json);
    sb_c_string(&b, symbol, "_variant", id);
    int rc = 0;
    if (b.bad) {
        fprintf(stderr, "attnres-gen: out of memory\n");
        rc = 1;
    } else {
        rc = write_file(path, b.p);
    }
    free(b.p);
    free(id);
    free(src);
    free(kernel);
    free(json);
    return rc;
}

/* Copies src with every occurrence of `from` replaced by `to`; NULL when
 * out of memory. */
static char *replace_all(const char *src, const char *from, const char *to)
{
    strbuf b = {0};
    size_t flen = strlen(from);
    const char *s = src, *hit;
    while (flen && (hit = strstr(s, from)) != NULL) {
        sb_put(&b, s, (size_t)(hit - s));
        sb_str(&b, to);
        s = hit + flen;
    }
    sb_str(&b, s);
    if (b.bad) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static int builtin(argen *g, const char *dtype, const char *level, const char *path)
{
    for (const char *c = level; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9'))) {
            fprintf(stderr, "attnres-gen: '%s' is not an ISA level name\n", level);
            return 1;
        }
    char *id = NULL, *src = NULL, *kernel = NULL, *json = NULL, *body = NULL;
    int step = 0, rc = 1;
    if (argen_builtin(g, dtype, level, &id, &step)) {
        fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
        return 1;
    }
    const char *op = argen_op(g);
    strbuf b = {0};
    char line[1024];
    if (!id) {
        snprintf(line, sizeof line,
                 "/* Generated by attnres-gen: templates/%s.lua names no built-in kernel for %s. */\n"
                 "#include <stdint.h>\nstruct attnres_cpu_%s_args;\n"
                 "const char ar_builtin_%s_%s_%s_variant[] = \"\";\n"
                 "const int ar_builtin_%s_%s_%s_step = 0;\n"
                 "void (*const ar_builtin_%s_%s_%s)(const struct attnres_cpu_%s_args *, int64_t, int64_t) = 0;\n",
                 argen_name(g), level, op, op, dtype, level, op, dtype, level, op, dtype, level, op);
        sb_str(&b, line);
    } else if (argen_emit(g, id, &src, &kernel, &json)) {
        fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
        goto done;
    } else {
        char renamed[512];
        snprintf(renamed, sizeof renamed, "%s_%s", kernel, level);
        if (!(body = replace_all(src, kernel, renamed))) {
            fprintf(stderr, "attnres-gen: out of memory\n");
            goto done;
        }
        sb_str(&b, body);
        snprintf(line, sizeof line,
                 "\n/* Names the runtime's table of built-in kernels uses (ISA level %s). */\n"
                 "const char ar_builtin_%s_%s_%s_variant[] = \"%s\";\n"
                 "const int ar_builtin_%s_%s_%s_step = %d;\n"
                 "void (*const ar_builtin_%s_%s_%s)(const struct attnres_cpu_%s_args *, int64_t, int64_t) = %s;\n",
                 level, op, dtype, level, id, op, dtype, level, step, op, dtype, level, op, renamed);
        sb_str(&b, line);
    }
    if (b.bad)
        fprintf(stderr, "attnres-gen: out of memory\n");
    else
        rc = write_file(path, b.p);
done:
    free(b.p);
    free(body);
    free(id);
    free(src);
    free(kernel);
    free(json);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: attnres-gen TEMPLATE_DIR list|emit|generic|generic-source|builtin|header TEMPLATE ...\n");
        return 2;
    }
    if (strcmp(argv[2], "header") == 0) {
        if (argc < 5) {
            fprintf(stderr, "usage: attnres-gen TEMPLATE_DIR header MODULE OUT.h [DEPFILE]\n");
            return 2;
        }
        return module_header(argv[1], argv[3], argv[4], argc >= 6 ? argv[5] : NULL);
    }
    char msg[2048];
    argen *g;
    if (argen_open(argv[1], argv[3], &g, msg, sizeof msg)) {
        fprintf(stderr, "attnres-gen: %s\n", msg);
        return 1;
    }
    int rc = 2;
    if (strcmp(argv[2], "list") == 0) {
        argen_variant *v;
        size_t n;
        rc = argen_enumerate(g, &v, &n);
        if (rc)
            fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
        for (size_t i = 0; !rc && i < n; i++)
            printf("%s\n", v[i].id);
        if (!rc)
            argen_variants_free(v, n);
    } else if (strcmp(argv[2], "emit") == 0 && argc >= 5) {
        rc = emit(g, argv[4], argc >= 6 ? argv[5] : NULL, NULL);
    } else if (strcmp(argv[2], "generic") == 0 && argc >= 6) {
        char *id;
        if (argen_generic(g, argv[4], &id)) {
            fprintf(stderr, "attnres-gen: %s\n", argen_errmsg(g));
            rc = 1;
        } else {
            rc = emit(g, id, argv[5], argv[4]);
            free(id);
            if (!rc)
                rc = write_depfile(g, argc >= 7 ? argv[6] : NULL, argv[5]);
        }
    } else if (strcmp(argv[2], "generic-source") == 0 && argc >= 7) {
        rc = generic_source(g, argv[4], argv[5], argv[6]);
        if (!rc)
            rc = write_depfile(g, argc >= 8 ? argv[7] : NULL, argv[5]);
    } else if (strcmp(argv[2], "builtin") == 0 && argc >= 7) {
        rc = builtin(g, argv[4], argv[5], argv[6]);
        if (!rc)
            rc = write_depfile(g, argc >= 8 ? argv[7] : NULL, argv[6]);
    } else {
        fprintf(stderr, "attnres-gen: unknown or incomplete command '%s'\n", argv[2]);
    }
    argen_close(g);
    return rc;
}
