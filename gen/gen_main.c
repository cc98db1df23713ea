/*
 * gen_main.c - attnres-gen, the build-time generator.
 *
 *   attnres-gen TEMPLATE_DIR list TEMPLATE
 *   attnres-gen TEMPLATE_DIR emit TEMPLATE ID [OUT.c]
 *   attnres-gen TEMPLATE_DIR generic TEMPLATE DTYPE OUT.c
 *
 * The build uses `generic` to compile the runtime's fallback kernels from the
 * same templates the tuner uses, so the library needs no Lua at run time.
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

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: attnres-gen TEMPLATE_DIR list|emit|generic TEMPLATE ...\n");
        return 2;
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
        }
    } else {
        fprintf(stderr, "attnres-gen: unknown or incomplete command '%s'\n", argv[2]);
    }
    argen_close(g);
    return rc;
}
