/* problems.c - presets and problems files; see problems.h. */
#include "problems.h"

#include "attnres-impl.h"
#include "parse_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A T bucket the tuner reads from a miss file is one the runtime records. */
_Static_assert(PROBLEM_MAX_T == AR_MISS_MAX_T, "the tuner's and the miss file's largest T bucket differ");

const char *const preset_names[] = {"ci", "default", "k3", "mhar-8b", "delta-small", NULL};

/* One preset line: the shape and its T buckets for the CPU and for GPUs. */
typedef struct preset_row {
    const char *preset;
    attnres_op op;
    int32_t s, fuse_add;
    attnres_dtype dtype;
    int64_t d;
    int32_t n, heads;
    attnres_form form;
    int32_t epilogue;
    int64_t cpu_t[PROBLEM_MAX_BUCKETS];
    int64_t gpu_t[PROBLEM_MAX_BUCKETS];
} preset_row;

#define R ATTNRES_FORM_REPLACE
#define A ATTNRES_FORM_ADDITIVE
static const preset_row rows[] = {
    /* ci: small and quick, every form once. */
    {"ci", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_F32, 256, 5, 1, R, 0, {1, 256}, {1, 256}},
    {"ci", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 512, 9, 4, A, 1, {64}, {64}},
    /* default: the shapes that matter (DESIGN §1) at sizes a CPU times in
     * seconds; GPUs take the full decode and prefill range. */
    {"default", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 7168, 9, 1, R, 0, {1, 64, 4096}, {1, 64, 4096, 16384}},
    {"default", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 4096, 9, 8, R, 0, {1, 4096}, {1, 64, 4096, 16384}},
    {"default", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_F32, 1024, 25, 1, A, 0, {64, 4096}, {1, 64, 4096}},
    {"default", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_F16, 2048, 9, 1, R, 1, {4096}, {1, 4096}},
    /* Kimi K3 Block AttnRes. */
    {"k3", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 7168, 9, 1, R, 0, {1, 64, 4096, 16384}, {1, 64, 4096, 16384}},
    /* MHAR-8B. */
    {"mhar-8b", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 4096, 9, 8, R, 0, {1, 64, 4096, 16384}, {1, 64, 4096, 16384}},
    /* Block AttnRes phases as K3 runs them (examples/k3_model.h): blocks of
     * 12 layers, so 24 sites per block against up to 8 earlier blocks and
     * the embedding; phase 2 adds the previous sublayer's output into b. */
    {"ci", ATTNRES_OP_PHASE1, 3, 0, ATTNRES_DTYPE_F32, 256, 4, 1, R, 0, {64}, {64}},
    {"ci", ATTNRES_OP_PHASE2, 0, 1, ATTNRES_DTYPE_F32, 256, 1, 1, R, 1, {64}, {64}},
    {"default", ATTNRES_OP_PHASE1, 24, 0, ATTNRES_DTYPE_BF16, 7168, 8, 1, R, 0, {1, 64}, {1, 64, 4096}},
    {"default", ATTNRES_OP_PHASE2, 0, 1, ATTNRES_DTYPE_BF16, 7168, 1, 1, R, 0, {1, 64, 4096}, {1, 64, 4096, 16384}},
    {"k3", ATTNRES_OP_PHASE1, 24, 0, ATTNRES_DTYPE_BF16, 7168, 8, 1, R, 0, {1, 64, 4096}, {1, 64, 4096, 16384}},
    {"k3", ATTNRES_OP_PHASE2, 0, 1, ATTNRES_DTYPE_BF16, 7168, 1, 1, R, 0, {1, 64, 4096}, {1, 64, 4096, 16384}},
    {"k3", ATTNRES_OP_PHASE2, 0, 0, ATTNRES_DTYPE_BF16, 7168, 1, 1, R, 0, {1, 64, 4096}, {1, 64, 4096, 16384}},
    /* Small models, Full and Delta AttnRes per sublayer (N up to 2L+1). */
    {"delta-small", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 1024, 25, 1, A, 0, {1, 64, 4096}, {1, 64, 4096, 16384}},
    {"delta-small", ATTNRES_OP_MIX, 0, 0, ATTNRES_DTYPE_BF16, 2048, 49, 1, A, 1, {1, 64, 4096}, {1, 64, 4096, 16384}},
};
#undef R
#undef A

static int push(problem_set *s, const attnres_problem *p, int64_t t)
{
    tune_problem *items = realloc(s->items, (s->count + 1) * sizeof *items);
    if (!items)
        return -1;
    s->items = items;
    s->items[s->count].p = *p;
    s->items[s->count].t = t;
    s->count++;
    return 0;
}

int problems_preset(const char *name, const char *backend, problem_set *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    int gpu = strcmp(backend, "cpu") != 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const preset_row *r = &rows[i];
        if (strcmp(r->preset, name) != 0)
            continue;
        attnres_problem p;
        attnres_problem_init(&p, r->dtype, r->d, r->n);
        p.op = r->op;
        p.s = r->s;
        p.fuse_add = r->fuse_add;
        p.heads = r->heads;
        p.form = r->form;
        p.epilogue = r->epilogue;
        const int64_t *ts = gpu ? r->gpu_t : r->cpu_t;
        for (int k = 0; k < PROBLEM_MAX_BUCKETS && ts[k]; k++)
            if (push(out, &p, ts[k])) {
                problems_free(out);
                snprintf(err, err_len, "out of memory");
                return -1;
            }
    }
    if (out->count == 0) {
        snprintf(err, err_len, "unknown preset '%s' (presets: ci, default, k3, mhar-8b, delta-small)", name);
        return -1;
    }
    return 0;
}

/* Longest line a problems file may have; a longer one is refused rather
 * than read as two lines. */
#define PROBLEM_LINE_MAX 4096

/* Parses a whole-token decimal integer in [min, max] into *out. The field's
 * name and range go into the message, so that a value beyond the range is
 * refused rather than truncated into a 32-bit field. */
static int parse_field(const char *tok, const char *name, long long min, long long max, long long *out, char *err,
                       size_t err_len, const char *path, int lineno)
{
    int64_t v;
    if (tune_parse_int(tok, min, max, &v) != 0) {
        snprintf(err, err_len, "%s:%d: %s must be an integer from %lld to %lld (got '%s')", path, lineno, name, min,
                 max, tok);
        return -1;
    }
    *out = v;
    return 0;
}

/* The fields of a line: 8 required, then at most one of each option. */
#define LINE_FIELDS 8
#define LINE_TOKENS_MAX (LINE_FIELDS + 2)

static int parse_line(char *line, problem_set *out, char *err, size_t err_len, const char *path, int lineno)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    char *tok[LINE_TOKENS_MAX], *save = NULL;
    int ntok = 0;
    for (char *t = strtok_r(line, " \t\r\n\v\f", &save); t; t = strtok_r(NULL, " \t\r\n\v\f", &save)) {
        if (ntok == LINE_TOKENS_MAX) {
            snprintf(err, err_len, "%s:%d: unexpected '%.40s' after the options (at most s=S and fuse=0|1)", path,
                     lineno, t);
            return -1;
        }
        tok[ntok++] = t;
    }
    if (ntok == 0)
        return 0;
    if (ntok < LINE_FIELDS) {
        snprintf(err, err_len, "%s:%d: expected 'op dtype d n heads form epilogue T,T,...' (%d of 8 fields given)",
                 path, lineno, ntok);
        return -1;
    }
    attnres_problem p;
    attnres_dtype dt;
    attnres_op opv;
    const char *op = tok[0], *dtype = tok[1], *form = tok[5];
    if (problem_op_parse(op, &opv)) {
        snprintf(err, err_len,
                 "%s:%d: op '%.40s' is not mix, phase1, phase2, mix_backward, phase1_backward or phase2_backward",
                 path, lineno, op);
        return -1;
    }
    if (attnres_dtype_parse(dtype, &dt)) {
        snprintf(err, err_len, "%s:%d: dtype '%.40s' is not f32, bf16 or f16", path, lineno, dtype);
        return -1;
    }
    long long d, n, heads, epilogue;
    if (parse_field(tok[2], "d", 1, PROBLEM_MAX_D, &d, err, err_len, path, lineno) ||
        parse_field(tok[3], "N", 1, PROBLEM_MAX_N, &n, err, err_len, path, lineno) ||
        parse_field(tok[4], "heads", 1, PROBLEM_MAX_HEADS, &heads, err, err_len, path, lineno) ||
        parse_field(tok[6], "epilogue", 0, 1, &epilogue, err, err_len, path, lineno))
        return -1;
    attnres_problem_init(&p, dt, d, (int32_t)n);
    p.op = opv;
    p.heads = (int32_t)heads;
    p.epilogue = (int32_t)epilogue;
    int have_s = 0, have_fuse = 0;
    for (int k = LINE_FIELDS; k < ntok; k++) {
        long long v;
        if (strncmp(tok[k], "s=", 2) == 0 && !have_s) {
            if (parse_field(tok[k] + 2, "s (sites per block)", 1, PROBLEM_MAX_S, &v, err, err_len, path, lineno))
                return -1;
            p.s = (int32_t)v;
            have_s = 1;
        } else if (strncmp(tok[k], "fuse=", 5) == 0 && !have_fuse) {
            if (parse_field(tok[k] + 5, "fuse", 0, 1, &v, err, err_len, path, lineno))
                return -1;
            p.fuse_add = (int32_t)v;
            have_fuse = 1;
        } else if (strncmp(tok[k], "s=", 2) == 0 || strncmp(tok[k], "fuse=", 5) == 0) {
            snprintf(err, err_len, "%s:%d: option '%.40s' is given twice", path, lineno, tok[k]);
            return -1;
        } else {
            snprintf(err, err_len, "%s:%d: unknown option '%.40s' (s=S or fuse=0|1)", path, lineno, tok[k]);
            return -1;
        }
    }
    if (strcmp(form, "replace") == 0)
        p.form = ATTNRES_FORM_REPLACE;
    else if (strcmp(form, "additive") == 0)
        p.form = ATTNRES_FORM_ADDITIVE;
    else {
        snprintf(err, err_len, "%s:%d: form '%.40s' is not replace or additive", path, lineno, form);
        return -1;
    }
    char msg[256];
    if (attnres_problem_check(&p, msg, sizeof msg) != ATTNRES_OK) {
        snprintf(err, err_len, "%s:%d: %s", path, lineno, msg);
        return -1;
    }
    /* The buckets: positive integers separated by single commas. An empty
     * bucket ("1,,64", a trailing comma) or a repeated one is a typo, not
     * something to skip silently. */
    size_t first = out->count;
    char *b = tok[7];
    for (;;) {
        char *comma = strchr(b, ',');
        if (comma)
            *comma = 0;
        long long t;
        if (!*b) {
            snprintf(err, err_len, "%s:%d: empty T bucket in '%s' (write T,T,... with no empty entries)", path,
                     lineno, tok[7]);
            return -1;
        }
        if (parse_field(b, "T bucket", 1, PROBLEM_MAX_T, &t, err, err_len, path, lineno))
            return -1;
        for (size_t j = first; j < out->count; j++)
            if (out->items[j].t == t) {
                snprintf(err, err_len, "%s:%d: T bucket %lld is listed twice", path, lineno, t);
                return -1;
            }
        if (push(out, &p, t)) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        if (!comma)
            break;
        *comma = ',';
        b = comma + 1;
    }
    return 0;
}

int problems_read_file(const char *path, problem_set *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, err_len, "cannot open problems file %s: %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > PROBLEM_LINE_MAX) {
            snprintf(err, err_len, "%s:%d: line longer than %d characters", path, lineno, PROBLEM_LINE_MAX);
            rc = -1;
        } else if (memchr(line, 0, (size_t)len)) {
            /* The rest of the line would be cut off unseen. */
            snprintf(err, err_len, "%s:%d: the line contains a NUL byte (a problems file is text)", path, lineno);
            rc = -1;
        } else {
            rc = parse_line(line, out, err, err_len, path, lineno);
        }
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, err_len, "reading problems file %s: %s", path, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc == 0 && out->count == 0) {
        snprintf(err, err_len, "problems file %s lists no problems", path);
        rc = -1;
    }
    if (rc != 0)
        problems_free(out);
    return rc;
}

int problems_read_misses(const char *path, const char *fingerprint, problem_set *out, int *torn, size_t *other,
                         char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    *other = 0;
    ar_miss *m = NULL;
    size_t n = 0;
    if (ar_miss_read_file(path, &m, &n, torn, err, err_len) != 0)
        return -1;
    /* The same problem and bucket from several devices is tuned once. */
    for (size_t i = 0; i < n; i++) {
        if (!fingerprint || strcmp(m[i].device, fingerprint) != 0)
            (*other)++;
        int dup = 0;
        for (size_t j = 0; j < out->count && !dup; j++)
            dup = out->items[j].t == m[i].t && memcmp(&out->items[j].p, &m[i].p, sizeof m[i].p) == 0;
        if (!dup && push(out, &m[i].p, m[i].t) != 0) {
            snprintf(err, err_len, "%s: out of memory", path);
            problems_free(out);
            free(m);
            return -1;
        }
    }
    free(m);
    if (out->count == 0) {
        snprintf(err, err_len, "%s: no misses recorded%s", path, *torn ? " (only a line cut short)" : "");
        return -1;
    }
    return 0;
}

void problems_free(problem_set *s)
{
    free(s->items);
    memset(s, 0, sizeof *s);
}

const char *problem_op_name(attnres_op op)
{
    /* The runtime's one table (ar_op_name), which plans, the database and
     * the miss file spell ops with; "mix" for a value outside it, as
     * before the table. */
    return (int)op >= 0 && (int)op < AR_OPS ? ar_op_name(op) : "mix";
}

int problem_op_parse(const char *name, attnres_op *op)
{
    static const attnres_op ops[] = {ATTNRES_OP_MIX,          ATTNRES_OP_PHASE1,          ATTNRES_OP_PHASE2,
                                     ATTNRES_OP_MIX_BACKWARD, ATTNRES_OP_PHASE1_BACKWARD, ATTNRES_OP_PHASE2_BACKWARD};
    _Static_assert(sizeof ops / sizeof ops[0] == AR_OPS, "an op of the runtime is missing here");
    for (size_t i = 0; name && i < sizeof ops / sizeof ops[0]; i++)
        if (strcmp(name, problem_op_name(ops[i])) == 0) {
            *op = ops[i];
            return 0;
        }
    return -1;
}

const char *problem_form_name(const attnres_problem *p)
{
    /* As plan.c records it: phase2's backward shares phase2's fields. */
    if (ar_op_forward(p->op) == ATTNRES_OP_PHASE2 && p->fuse_add)
        return "fused";
    return p->form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace";
}

void problem_describe(const tune_problem *tp, char *buf, size_t len)
{
    const attnres_problem *p = &tp->p;
    char sites[32] = "";
    const attnres_op fwd = ar_op_forward(p->op);
    if (fwd == ATTNRES_OP_PHASE1)
        snprintf(sites, sizeof sites, " S=%d", p->s);
    if (fwd == ATTNRES_OP_PHASE2)
        snprintf(buf, len, "%s %s d=%lld H=%d %s%s T=%lld", problem_op_name(p->op), attnres_dtype_name(p->dtype),
                 (long long)p->d, p->heads, problem_form_name(p), p->epilogue ? "+norm" : "", (long long)tp->t);
    else
        snprintf(buf, len, "%s %s d=%lld N=%d%s H=%d %s%s T=%lld", problem_op_name(p->op),
                 attnres_dtype_name(p->dtype), (long long)p->d, p->n, sites, p->heads, problem_form_name(p),
                 p->epilogue ? "+norm" : "", (long long)tp->t);
}

double problem_bytes(const tune_problem *tp)
{
    /* One count of the traffic: the split below, summed. */
    double rd, wr;
    problem_traffic(tp, &rd, &wr);
    return rd + wr;
}

void problem_traffic(const tune_problem *tp, double *read_bytes, double *write_bytes)
{
    const attnres_problem *p = &tp->p;
    const double td = (double)tp->t * (double)p->d, es = (double)attnres_dtype_size(p->dtype);
    const double lse = 4.0 * (double)tp->t * p->heads;
    switch (p->op) {
    case ATTNRES_OP_PHASE1:
        *read_bytes = p->n * td * es;
        *write_bytes = p->s * (td * es + lse);
        break;
    case ATTNRES_OP_PHASE2: /* o1, lse, b (and f) in; out (normed, and b) out */
        *read_bytes = (2.0 + (p->fuse_add ? 1.0 : 0.0)) * td * es + lse;
        *write_bytes = (1.0 + (p->epilogue ? 1.0 : 0.0) + (p->fuse_add ? 1.0 : 0.0)) * td * es;
        break;
    case ATTNRES_OP_MIX_BACKWARD: /* sources and dout (and out, dnormed) in; source gradients (and dpartial) out */
        *read_bytes = (p->n + 1.0 + (p->epilogue ? 2.0 : 0.0)) * td * es;
        *write_bytes = (p->n + (p->form == ATTNRES_FORM_ADDITIVE ? 1.0 : 0.0)) * td * es;
        break;
    case ATTNRES_OP_PHASE1_BACKWARD: /* n sources, S do1 rows and S dlse rows in; n source gradients out */
        *read_bytes = (p->n + (double)p->s) * td * es + p->s * lse;
        *write_bytes = p->n * td * es;
        break;
    case ATTNRES_OP_PHASE2_BACKWARD: /* o1, b, dout (and dnormed), lse in; do1, db (and dsublayer), dlse out */
        *read_bytes = (3.0 + (p->epilogue ? 1.0 : 0.0)) * td * es + lse;
        *write_bytes = (2.0 + (p->fuse_add ? 1.0 : 0.0)) * td * es + lse;
        break;
    default:
        *read_bytes = (p->n + (p->form == ATTNRES_FORM_ADDITIVE)) * td * es;
        *write_bytes = (1.0 + (p->epilogue ? 1.0 : 0.0)) * td * es;
        break;
    }
}

double problem_flops(const tune_problem *tp)
{
    const attnres_problem *p = &tp->p;
    const double elements = (double)p->n * (double)tp->t * (double)p->d;
    /* per element of the n source rows: one FMA for its square, one for each
     * site's dot product and one for each site's mix, 2 flop each */
    if (p->op == ATTNRES_OP_PHASE1)
        return elements * (2.0 + 4.0 * p->s);
    /* the backward's two sweeps (templates/cpu/phase1_backward.lua), per
     * element of the n source rows: an FMA for its square and, per site,
     * one for each dot, with u and with do1 (sweep 1); a multiply for the
     * r^3 term and, per site, an FMA each for do1's and u's share of the
     * gradient and one for du's update (sweep 2) */
    if (p->op == ATTNRES_OP_PHASE1_BACKWARD)
        return elements * (3.0 + 10.0 * p->s);
    return 0.0;
}
