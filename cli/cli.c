/* cli.c - see cli.h. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "parse_int.h"

int cli_parse_double(const char *cmd, const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno == ERANGE) {
        cli_error(cmd, "%s expects a number, got '%s'", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int_range(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max,
                        int64_t *out)
{
    if (tune_parse_int(text, min, max, out) != 0) {
        cli_error(cmd, "%s must be an integer from %lld to %lld (got '%s')", flag, (long long)min, (long long)max,
                  text);
        return -1;
    }
    return 0;
}

int cli_parse_positive(const char *cmd, const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno == ERANGE || !isfinite(v) || !(v > 0)) {
        cli_error(cmd, "%s must be a positive finite number (got '%s')", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_dtype(const char *cmd, const char *flag, const char *value, void *dst)
{
    if (attnres_dtype_parse(value, (attnres_dtype *)dst) != ATTNRES_OK) {
        cli_error(cmd, "%s must be f32, bf16 or f16 (got '%s')", flag, value);
        return -1;
    }
    return 0;
}

int cli_parse_op(const char *cmd, const char *flag, const char *value, void *dst)
{
    static const struct {
        const char *name;
        attnres_op op;
    } ops[] = {{"mix", ATTNRES_OP_MIX},
               {"phase1", ATTNRES_OP_PHASE1},
               {"phase2", ATTNRES_OP_PHASE2},
               {"mix_backward", ATTNRES_OP_MIX_BACKWARD},
               {"phase1_backward", ATTNRES_OP_PHASE1_BACKWARD},
               {"phase2_backward", ATTNRES_OP_PHASE2_BACKWARD}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (strcmp(value, ops[k].name) == 0) {
            *(attnres_op *)dst = ops[k].op;
            return 0;
        }
    cli_error(cmd, "%s must be mix, phase1, phase2, mix_backward, phase1_backward or phase2_backward (got '%s')",
              flag, value);
    return -1;
}

/* "a, b or c" for a choice's message. */
static void choice_list(const char *const *choices, char *buf, size_t len)
{
    size_t n = 0, used = 0;
    while (choices[n])
        n++;
    buf[0] = 0;
    for (size_t k = 0; k < n && used < len; k++) {
        const char *sep = k == 0 ? "" : k + 1 == n ? " or " : ", ";
        int w = snprintf(buf + used, len - used, "%s%s", sep, choices[k]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

static int take_value(const cli_spec *s, const cli_opt *o, const char *v)
{
    int64_t n;
    switch (o->type) {
    case CLI_FLAG:
        *(int *)o->dst = 1;
        return 0;
    case CLI_STRING:
        *(const char **)o->dst = v;
        return 0;
    case CLI_INT:
        if (cli_parse_int_range(s->cmd, o->name, v, o->min, o->max, &n))
            return -1;
        *(int *)o->dst = (int)n; /* in range, which the table keeps within int */
        return 0;
    case CLI_INT64:
        return cli_parse_int_range(s->cmd, o->name, v, o->min, o->max, (int64_t *)o->dst);
    case CLI_DOUBLE:
        return cli_parse_double(s->cmd, o->name, v, (double *)o->dst);
    case CLI_POSITIVE:
        return cli_parse_positive(s->cmd, o->name, v, (double *)o->dst);
    case CLI_CHOICE:
        for (int k = 0; o->choices[k]; k++)
            if (strcmp(v, o->choices[k]) == 0) {
                *(int *)o->dst = k;
                return 0;
            }
        char names[256];
        choice_list(o->choices, names, sizeof names);
        cli_error(s->cmd, "%s must be %s (got '%s')", o->name, names, v);
        return -1;
    case CLI_CUSTOM:
        return o->parse(s->cmd, o->name, v, o->dst);
    }
    return -1;
}

int cli_parse(const cli_spec *s, int argc, char **argv)
{
    int npos = 0, options_done = 0;
    if (s->npos)
        *s->npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int option_like = !options_done && a[0] == '-' && a[1] && (a[1] == '-' || !s->dash_positional);
        if (option_like && strcmp(a, "--") == 0) {
            options_done = 1;
            continue;
        }
        if (option_like && s->usage && (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)) {
            fputs(s->usage, stdout);
            return CLI_HELP;
        }
        if (option_like) {
            const cli_opt *o = s->opts;
            while (o && o->name && strcmp(o->name, a) != 0)
                o++;
            if (!o || !o->name) {
                cli_error(s->cmd, "unknown option '%s' (see attnres %s --help)", a, s->cmd);
                return -1;
            }
            const char *v = NULL;
            if (o->type != CLI_FLAG) {
                if (i + 1 >= argc) {
                    cli_error(s->cmd, "%s needs a value", a);
                    return -1;
                }
                v = argv[++i];
            }
            if (take_value(s, o, v))
                return -1;
            if (o->seen)
                *o->seen = 1;
            continue;
        }
        if (npos >= s->max_pos) {
            if (s->max_pos == 0)
                cli_error(s->cmd, "unexpected argument '%s' (see attnres %s --help)", a, s->cmd);
            else
                cli_error(s->cmd, "%s ('%s' is extra)", s->extra ? s->extra : "too many arguments", a);
            return -1;
        }
        s->pos[npos++] = a;
        if (s->npos)
            *s->npos = npos;
    }
    if (npos < s->min_pos) {
        cli_error(s->cmd, "%s", s->missing);
        return -1;
    }
    for (const cli_opt *o = s->opts; o && o->name; o++)
        if (o->required && !*(const char **)o->dst) {
            cli_error(s->cmd, "%s", o->required);
            return -1;
        }
    return CLI_PARSED;
}
