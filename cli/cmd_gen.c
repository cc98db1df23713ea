/* cmd_gen.c - `attnres gen`: the variant space and the generated source. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argen.h"
#include "cli.h"
#include "tuner_base.h"

static const char gen_usage[] =
    "usage: attnres gen --list [--template NAME]\n"
    "       attnres gen [--template NAME] ID\n"
    "\n"
    "  --list prints every variant id of the templates (one a line);\n"
    "  ID prints that variant's generated source. NAME is e.g. cpu/mix or\n"
    "  cuda/mix_online; without it every template is searched. Templates are\n"
    "  read from $ATTNRES_TEMPLATE_DIR or the installed/source templates\n"
    "  folder.\n";

/* Runs fn over each template (or just `only`); stops at a non-zero result. */
static int for_each_template(const char *only, int (*fn)(argen *g, void *ctx), void *ctx)
{
    const char *dir = artuner_template_dir();
    char **names = NULL;
    size_t count = 0;
    if (only) {
        names = malloc(sizeof *names);
        if (!names)
            return -1;
        names[0] = strdup(only);
        count = 1;
    } else if (argen_list_templates(dir, &names, &count) || count == 0) {
        cli_error("gen", "no templates found in %s", dir);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        char msg[2048];
        argen *g;
        if (argen_open(dir, names[i], &g, msg, sizeof msg)) {
            cli_error("gen", "%s", msg);
            rc = -1;
            break;
        }
        rc = fn(g, ctx);
        argen_close(g);
    }
    argen_names_free(names, count);
    return rc;
}

static int list_one(argen *g, void *ctx)
{
    (void)ctx;
    argen_variant *v;
    size_t n;
    if (argen_enumerate(g, &v, &n)) {
        cli_error("gen", "%s", argen_errmsg(g));
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        printf("%s\n", v[i].id);
    argen_variants_free(v, n);
    return 0;
}

typedef struct find_ctx {
    const char *id;
    int found;
} find_ctx;

static int print_one(argen *g, void *ctxp)
{
    find_ctx *ctx = ctxp;
    argen_variant *v;
    size_t n;
    if (argen_enumerate(g, &v, &n)) {
        cli_error("gen", "%s", argen_errmsg(g));
        return -1;
    }
    int here = 0;
    for (size_t i = 0; i < n && !here; i++)
        here = strcmp(v[i].id, ctx->id) == 0;
    argen_variants_free(v, n);
    if (!here)
        return 0;
    char *src, *kernel, *json;
    if (argen_emit(g, ctx->id, &src, &kernel, &json)) {
        cli_error("gen", "%s", argen_errmsg(g));
        return -1;
    }
    fputs(src, stdout);
    free(src);
    free(kernel);
    free(json);
    ctx->found = 1;
    return 1;
}

int cmd_gen(int argc, char **argv)
{
    const char *only = NULL, *id = NULL;
    int list = 0;
    const cli_opt opts[] = {CLI_OPT_FLAG("--list", &list), CLI_OPT_STRING("--template", &only), CLI_OPT_END};
    const cli_spec spec = {.cmd = "gen", .usage = gen_usage, .opts = opts, .pos = &id, .max_pos = 1,
                           .extra = "one variant id at a time"};
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED)
        return rc == CLI_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (list == !!id) {
        cli_error("gen", "give either --list or a variant id (see attnres gen --help)");
        return CLI_EXIT_USAGE;
    }
    if (list)
        return for_each_template(only, list_one, NULL) < 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
    find_ctx ctx = {id, 0};
    if (for_each_template(only, print_one, &ctx) < 0)
        return CLI_EXIT_FAIL;
    if (!ctx.found) {
        cli_error("gen", "no variant '%s' (attnres gen --list shows them)", id);
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
