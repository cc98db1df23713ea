/*
 * ptx_parse.c - PTX text to decoded instructions (see ptx.h).
 *
 * A small scanner produces tokens with their line numbers; the parser walks
 * module directives, entry functions and their bodies, and decodes each
 * instruction's dotted opcode into the fields of ptx_instr. Symbols
 * (parameters, shared and global variables, labels) are resolved when a
 * function's body is complete, because the dynamic shared window begins
 * after every static shared variable. Every form the interpreter does not
 * implement is refused here, naming the line.
 */
#include "ptx.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- types ---------------------------------------------------------- */

static const struct {
    const char *name;
    ptx_type type;
} type_table[] = {
    {"pred", PT_PRED}, {"b8", PT_B8},   {"b16", PT_B16},     {"b32", PT_B32},   {"b64", PT_B64},
    {"u8", PT_U8},     {"u16", PT_U16}, {"u32", PT_U32},     {"u64", PT_U64},   {"s8", PT_S8},
    {"s16", PT_S16},   {"s32", PT_S32}, {"s64", PT_S64},     {"f16", PT_F16},   {"f16x2", PT_F16X2},
    {"bf16", PT_BF16}, {"bf16x2", PT_BF16X2}, {"f32", PT_F32}, {"f64", PT_F64},
};

static ptx_type type_from(const char *s)
{
    for (size_t i = 0; i < sizeof type_table / sizeof type_table[0]; i++)
        if (strcmp(s, type_table[i].name) == 0)
            return type_table[i].type;
    return PT_NONE;
}


const char *ptx_type_name(ptx_type t)
{
    for (size_t i = 0; i < sizeof type_table / sizeof type_table[0]; i++)
        if (type_table[i].type == t)
            return type_table[i].name;
    return "none";
}

int ptx_type_is_signed(ptx_type t)
{
    return t == PT_S8 || t == PT_S16 || t == PT_S32 || t == PT_S64;
}

int ptx_type_is_float(ptx_type t)
{
    return t == PT_F16 || t == PT_F16X2 || t == PT_BF16 || t == PT_BF16X2 || t == PT_F32 || t == PT_F64;
}

/* ---- scanner -------------------------------------------------------- */

typedef struct token {
    char text[256];
    int line;
    char kind; /* 'i' identifier/directive/register, 'n' number, 's' string, else the punctuation char */
} token;

typedef struct parser {
    const char *p;
    int line;
    token tok;    /* the current token */
    int have;     /* tok is valid */
    char *err;
    size_t errlen;
    int failed;
    ptx_module *m;
} parser;

static int fail(parser *ps, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *ps, int line, const char *fmt, ...)
{
    if (ps->failed)
        return -1;
    ps->failed = 1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ps->err, ps->errlen, "PTX line %d: %s", line, msg);
    return -1;
}

static int is_ident_start(int c)
{
    return isalpha(c) || c == '_' || c == '$' || c == '%' || c == '.';
}

static int is_ident_char(int c)
{
    return isalnum(c) || c == '_' || c == '$' || c == '.';
}

/* Reads the next token into ps->tok; kind 0 at the end of the text. */
static void scan(parser *ps)
{
    const char *p = ps->p;
    for (;;) {
        while (*p && isspace((unsigned char)*p)) {
            if (*p == '\n')
                ps->line++;
            p++;
        }
        if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n')
                p++;
            continue;
        }
        if (p[0] == '/' && p[1] == '*') {
            p += 2;
            while (*p && !(p[0] == '*' && p[1] == '/')) {
                if (*p == '\n')
                    ps->line++;
                p++;
            }
            if (*p)
                p += 2;
            continue;
        }
        break;
    }
    token *t = &ps->tok;
    t->line = ps->line;
    t->text[0] = 0;
    size_t n = 0;
    if (!*p) {
        t->kind = 0;
    } else if (is_ident_start((unsigned char)*p)) {
        t->kind = 'i';
        t->text[n++] = *p++;
        while (*p && is_ident_char((unsigned char)*p) && n + 1 < sizeof t->text)
            t->text[n++] = *p++;
        if (n == 1 && t->text[0] == '%') /* nothing after % */
            t->kind = '%';
    } else if (isdigit((unsigned char)*p)) {
        t->kind = 'n';
        while (*p && (isalnum((unsigned char)*p) || *p == '.') && n + 1 < sizeof t->text)
            t->text[n++] = *p++;
    } else if (*p == '"') {
        t->kind = 's';
        p++;
        while (*p && *p != '"' && *p != '\n' && n + 1 < sizeof t->text)
            t->text[n++] = *p++;
        if (*p == '"')
            p++;
    } else {
        t->kind = *p;
        t->text[n++] = *p++;
    }
    t->text[n] = 0;
    ps->p = p;
    ps->have = 1;
}

static int accept(parser *ps, char kind)
{
    if (ps->tok.kind == kind) {
        scan(ps);
        return 1;
    }
    return 0;
}

static int expect(parser *ps, char kind, const char *what)
{
    if (accept(ps, kind))
        return 0;
    return fail(ps, ps->tok.line, "expected %s, found `%s`", what, ps->tok.text);
}

static int is_word(const parser *ps, const char *w)
{
    return ps->tok.kind == 'i' && strcmp(ps->tok.text, w) == 0;
}

/* Integer literal: decimal, hexadecimal (0x), octal (0...), binary (0b); an
 * optional U suffix. */
static int parse_int_text(const char *s, int64_t *v)
{
    char *end;
    unsigned long long u;
    if (s[0] == '0' && (s[1] == 'b' || s[1] == 'B'))
        u = strtoull(s + 2, &end, 2);
    else
        u = strtoull(s, &end, 0);
    if (*end == 'U' || *end == 'u')
        end++;
    if (*end)
        return -1;
    *v = (int64_t)u;
    return 0;
}

/* A number token: integers, 0fXXXXXXXX (f32 bits), 0dXXXXXXXXXXXXXXXX (f64
 * bits) or a decimal float (returned as f64 bits with *is_f64 set). */
static int parse_number(const char *s, int64_t *v, int *is_float)
{
    *is_float = 0;
    if (s[0] == '0' && (s[1] == 'f' || s[1] == 'F') && strlen(s) == 10) {
        *v = (int64_t)strtoull(s + 2, NULL, 16);
        *is_float = 32;
        return 0;
    }
    if (s[0] == '0' && (s[1] == 'd' || s[1] == 'D') && strlen(s) == 18) {
        *v = (int64_t)strtoull(s + 2, NULL, 16);
        *is_float = 64;
        return 0;
    }
    if (strchr(s, '.') || ((strchr(s, 'e') || strchr(s, 'E')) && !(s[0] == '0' && (s[1] == 'x' || s[1] == 'X')))) {
        char *end;
        double d = strtod(s, &end);
        if (*end)
            return -1;
        memcpy(v, &d, sizeof d);
        *is_float = 64;
        return 0;
    }
    return parse_int_text(s, v);
}

/* ---- registers and symbols ------------------------------------------ */

typedef struct reg_decl {
    char prefix[256];
    int32_t count; /* -1: a single register named prefix */
    int32_t base;
    ptx_type type;
} reg_decl;

typedef enum sym_kind { SYM_PARAM, SYM_SHARED, SYM_DYNSHARED, SYM_GLOBAL } sym_kind;

typedef struct symbol {
    char name[256];
    sym_kind kind;
    int64_t value; /* param offset, shared offset or global index */
} symbol;

typedef struct fixup {
    int32_t instr, operand;
    int64_t addend;
    char name[256];
    int line;
} fixup;

typedef struct fbuild {
    ptx_function *f;
    reg_decl *regs;
    int nregs, capregs;
    symbol *syms;
    int nsyms, capsyms;
    fixup *fix;
    int nfix, capfix;
    struct {
        char name[256];
        int32_t at;
    } *labels;
    int nlabels, caplabels;
    int capcode;
    int has_dynamic;
} fbuild;

#define GROW(arr, n, cap)                                                  \
    do {                                                                   \
        if ((n) >= (cap)) {                                                \
            int nc_ = (cap) ? 2 * (cap) : 16;                              \
            void *np_ = realloc((arr), (size_t)nc_ * sizeof *(arr));       \
            if (!np_)                                                      \
                return fail(ps, ps->tok.line, "out of memory");            \
            (arr) = np_;                                                   \
            (cap) = nc_;                                                   \
        }                                                                  \
    } while (0)

/* Appends a symbol to a growing table: a function's or the module's. */
static int push_symbol(parser *ps, symbol **syms, int *nsyms, int *capsyms, const char *name, sym_kind kind,
                       int64_t value)
{
    GROW(*syms, *nsyms, *capsyms);
    symbol *s = &(*syms)[(*nsyms)++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->kind = kind;
    s->value = value;
    return 0;
}

static int add_symbol(parser *ps, fbuild *fb, const char *name, sym_kind kind, int64_t value)
{
    return push_symbol(ps, &fb->syms, &fb->nsyms, &fb->capsyms, name, kind, value);
}

static const symbol *find_symbol(const fbuild *fb, const char *name)
{
    for (int i = fb->nsyms - 1; i >= 0; i--)
        if (strcmp(fb->syms[i].name, name) == 0)
            return &fb->syms[i];
    return NULL;
}

/* The slot of a register name, or -1. */
static int find_reg(const fbuild *fb, const char *name)
{
    for (int i = 0; i < fb->nregs; i++) {
        const reg_decl *d = &fb->regs[i];
        size_t pl = strlen(d->prefix);
        if (d->count < 0) {
            if (strcmp(name, d->prefix) == 0)
                return d->base;
            continue;
        }
        if (strncmp(name, d->prefix, pl) != 0 || !name[pl])
            continue;
        const char *num = name + pl;
        int ok = 1;
        for (const char *c = num; *c; c++)
            ok &= isdigit((unsigned char)*c) != 0;
        if (!ok || (num[0] == '0' && num[1]))
            continue;
        long k = strtol(num, NULL, 10);
        if (k < d->count)
            return d->base + (int)k;
    }
    return -1;
}

static int special_reg(const char *name)
{
    static const char *const names[] = {"%tid.x",    "%tid.y",    "%tid.z",    "%ntid.x",   "%ntid.y",
                                        "%ntid.z",   "%ctaid.x",  "%ctaid.y",  "%ctaid.z",  "%nctaid.x",
                                        "%nctaid.y", "%nctaid.z", "%laneid",   "%warpid"};
    for (int i = 0; i < (int)(sizeof names / sizeof names[0]); i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

/* ---- module-level state -------------------------------------------- */

typedef struct mbuild {
    symbol *syms; /* module-scope .global and .shared variables */
    int nsyms, capsyms;
    int64_t shared_bytes; /* module-scope static shared */
    char dyn_name[256];   /* the module-scope .extern .shared window */
    int64_t dyn_align;
    int capfuncs, capglobals;
} mbuild;

static int64_t align_up(int64_t v, int64_t a)
{
    return a > 1 ? (v + a - 1) / a * a : v;
}

/* `.align N .type name[N] = {...}` after the state space, up to ';'.
 * Fills the declared name, size, alignment and (for .global) the data. */
typedef struct var_decl {
    char name[256];
    int64_t align, size, elem;
    ptx_type type;
    uint8_t *init;
    int is_array_unsized;
} var_decl;

static int parse_var_decl(parser *ps, var_decl *v, int want_init)
{
    memset(v, 0, sizeof *v);
    v->align = 0;
    int line = ps->tok.line;
    for (;;) {
        if (is_word(ps, ".align")) {
            scan(ps);
            int64_t a;
            if (ps->tok.kind != 'n' || parse_int_text(ps->tok.text, &a) || a < 1 || a > 4096 || (a & (a - 1)))
                return fail(ps, line, "bad .align `%s`", ps->tok.text);
            v->align = a;
            scan(ps);
        } else if (ps->tok.kind == 'i' && ps->tok.text[0] == '.' && type_from(ps->tok.text + 1) != PT_NONE) {
            v->type = type_from(ps->tok.text + 1);
            scan(ps);
        } else if (ps->tok.kind == 'i' && ps->tok.text[0] == '.') {
            return fail(ps, line, "variable attribute `%s` is not supported", ps->tok.text);
        } else {
            break;
        }
    }
    if (v->type == PT_NONE || v->type == PT_PRED)
        return fail(ps, line, "a variable needs a data type");
    if (ps->tok.kind != 'i')
        return fail(ps, line, "expected a variable name, found `%s`", ps->tok.text);
    snprintf(v->name, sizeof v->name, "%s", ps->tok.text);
    scan(ps);
    v->elem = ptx_type_bytes(v->type);
    v->size = v->elem;
    if (!v->align)
        v->align = v->elem;
    if (accept(ps, '[')) {
        if (ps->tok.kind == ']') {
            v->is_array_unsized = 1;
            v->size = 0;
        } else {
            int64_t n;
            if (ps->tok.kind != 'n' || parse_int_text(ps->tok.text, &n) || n < 0 || n > (1 << 28))
                return fail(ps, line, "bad array size `%s`", ps->tok.text);
            v->size = n * v->elem;
            scan(ps);
        }
        if (expect(ps, ']', "]"))
            return -1;
    }
    if (accept(ps, '=')) {
        if (!want_init)
            return fail(ps, line, "an initialiser is only supported on .global variables");
        int64_t count = v->size / (v->elem ? v->elem : 1);
        v->init = calloc(1, (size_t)(v->size ? v->size : 1));
        if (!v->init)
            return fail(ps, line, "out of memory");
        int braces = accept(ps, '{');
        for (int64_t i = 0;; i++) {
            int neg = accept(ps, '-');
            int64_t val;
            int isf;
            if (ps->tok.kind != 'n' || parse_number(ps->tok.text, &val, &isf))
                return fail(ps, line, "bad initialiser `%s`", ps->tok.text);
            scan(ps);
            if (isf == 64 && v->type == PT_F32) {
                double d;
                memcpy(&d, &val, 8);
                float f = (float)(neg ? -d : d);
                uint32_t b;
                memcpy(&b, &f, 4);
                val = b;
            } else if (neg) {
                val = -val;
            }
            if (i >= count)
                return fail(ps, line, "too many initialisers for %s", v->name);
            memcpy(v->init + i * v->elem, &val, (size_t)v->elem); /* little-endian */
            if (!braces || !accept(ps, ','))
                break;
        }
        if (braces && expect(ps, '}', "}"))
            return -1;
    }
    return expect(ps, ';', ";");
}

/* ---- instruction decoding ------------------------------------------ */

static const struct {
    const char *name;
    ptx_opcode op;
} op_table[] = {
    {"mov", OP_MOV},     {"add", OP_ADD},     {"sub", OP_SUB},   {"mul", OP_MUL},     {"mad", OP_MAD},
    {"fma", OP_FMA},     {"div", OP_DIV},     {"rem", OP_REM},   {"neg", OP_NEG},     {"abs", OP_ABS},
    {"min", OP_MIN},     {"max", OP_MAX},     {"and", OP_AND},   {"or", OP_OR},       {"xor", OP_XOR},
    {"not", OP_NOT},     {"shl", OP_SHL},     {"shr", OP_SHR},   {"bfi", OP_BFI},     {"bfe", OP_BFE},
    {"cvt", OP_CVT},     {"cvta", OP_CVTA},   {"setp", OP_SETP}, {"selp", OP_SELP},   {"ex2", OP_EX2},
    {"rsqrt", OP_RSQRT}, {"sqrt", OP_SQRT},   {"rcp", OP_RCP},   {"lg2", OP_LG2},     {"ld", OP_LD},
    {"st", OP_ST},       {"shfl", OP_SHFL},   {"bar", OP_BAR},   {"barrier", OP_BAR}, {"bra", OP_BRA},
    {"ret", OP_RET},     {"exit", OP_EXIT},
};

static const char *const cmp_names[] = {"eq",  "ne",  "lt",  "le",  "gt",  "ge",  "lo",  "ls",  "hi",
                                        "hs",  "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};

/* Decodes "ld.global.nc.v4.f32" into the instruction's fields. */
static int decode_opcode(parser *ps, const char *text, ptx_instr *in, int line)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    char *base = strtok_r(buf, ".", &save);
    int found = 0;
    for (size_t i = 0; base && i < sizeof op_table / sizeof op_table[0]; i++)
        if (strcmp(base, op_table[i].name) == 0) {
            in->op = (uint8_t)op_table[i].op;
            found = 1;
        }
    if (!found)
        return fail(ps, line, "unknown opcode `%s`", text);
    ptx_type types[3];
    int ntypes = 0, sync = 0, aligned = 0, to = 0, cmp_set = 0;
    in->vec = 1;
    for (char *m = strtok_r(NULL, ".", &save); m; m = strtok_r(NULL, ".", &save)) {
        ptx_type t = type_from(m);
        if (t != PT_NONE && t != PT_PRED) {
            if (ntypes == 3)
                return fail(ps, line, "too many types in `%s`", text);
            types[ntypes++] = t;
        } else if (t == PT_PRED) {
            types[ntypes++] = t;
        } else if (!strcmp(m, "rn") || !strcmp(m, "rz") || !strcmp(m, "rm") || !strcmp(m, "rp") ||
                   !strcmp(m, "rni") || !strcmp(m, "rzi") || !strcmp(m, "rmi") || !strcmp(m, "rpi")) {
            static const char *const r[] = {"rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi"};
            for (int k = 0; k < 8; k++)
                if (!strcmp(m, r[k]))
                    in->rnd = (uint8_t)(RND_RN + k);
        } else if (!strcmp(m, "ftz")) {
            in->ftz = 1;
        } else if (!strcmp(m, "sat")) {
            in->sat = 1;
        } else if (!strcmp(m, "approx")) {
            in->approx = 1;
        } else if (!strcmp(m, "full") && in->op == OP_DIV) {
            in->approx = 2;
        } else if (!strcmp(m, "nc") && in->op == OP_LD) {
            in->nc = 1;
        } else if (!strcmp(m, "uni") && in->op == OP_BRA) {
            in->uni = 1;
        } else if (!strcmp(m, "sync") && (in->op == OP_SHFL || in->op == OP_BAR)) {
            sync = 1;
        } else if (!strcmp(m, "aligned") && in->op == OP_BAR) {
            aligned = 1;
        } else if (in->op == OP_SHFL && (!strcmp(m, "up") || !strcmp(m, "down") || !strcmp(m, "bfly") ||
                                         !strcmp(m, "idx"))) {
            in->mode = !strcmp(m, "up") ? SHFL_UP : !strcmp(m, "down") ? SHFL_DOWN : !strcmp(m, "bfly") ? SHFL_BFLY
                                                                                                       : SHFL_IDX;
        } else if ((in->op == OP_MUL || in->op == OP_MAD) &&
                   (!strcmp(m, "lo") || !strcmp(m, "hi") || !strcmp(m, "wide"))) {
            in->mode = !strcmp(m, "lo") ? MUL_LO : !strcmp(m, "hi") ? MUL_HI : MUL_WIDE;
        } else if ((in->op == OP_LD || in->op == OP_ST || in->op == OP_CVTA) &&
                   (!strcmp(m, "global") || !strcmp(m, "shared") || !strcmp(m, "param"))) {
            in->space = !strcmp(m, "global") ? SP_GLOBAL : !strcmp(m, "shared") ? SP_SHARED : SP_PARAM;
        } else if ((in->op == OP_LD || in->op == OP_ST) && (!strcmp(m, "v2") || !strcmp(m, "v4"))) {
            in->vec = (uint8_t)(m[1] - '0');
        } else if (in->op == OP_CVTA && !strcmp(m, "to")) {
            to = 1;
        } else if (in->op == OP_SETP && !cmp_set) {
            int k;
            for (k = 0; k < (int)(sizeof cmp_names / sizeof cmp_names[0]); k++)
                if (!strcmp(m, cmp_names[k]))
                    break;
            if (k == (int)(sizeof cmp_names / sizeof cmp_names[0]))
                return fail(ps, line, "unknown comparison `.%s` in `%s`", m, text);
            in->cmp = (uint8_t)k;
            cmp_set = 1;
        } else if (in->op == OP_SETP && (!strcmp(m, "and") || !strcmp(m, "or") || !strcmp(m, "xor"))) {
            in->boolop = (uint8_t)(!strcmp(m, "and") ? 1 : !strcmp(m, "or") ? 2 : 3);
        } else {
            return fail(ps, line, "modifier `.%s` of `%s` is not supported", m, text);
        }
    }
    if (in->op == OP_CVT) {
        if (ntypes != 2)
            return fail(ps, line, "`%s` needs a destination and a source type", text);
        in->type = (uint8_t)types[0];
        in->stype = (uint8_t)types[1];
    } else if (in->op == OP_BAR || in->op == OP_BRA || in->op == OP_RET || in->op == OP_EXIT) {
        if (ntypes)
            return fail(ps, line, "`%s` takes no type", text);
    } else {
        if (ntypes != 1)
            return fail(ps, line, "`%s` needs exactly one type", text);
        in->type = (uint8_t)types[0];
    }
    if (in->op == OP_SHFL && !sync)
        return fail(ps, line, "`%s`: only shfl.sync is supported (sm_70 and later)", text);
    if (in->op == OP_BAR && !sync)
        return fail(ps, line, "`%s`: only bar.sync / barrier.sync.aligned are supported", text);
    if (in->op == OP_BAR && !strcmp(base, "barrier") && !aligned)
        return fail(ps, line, "`%s`: the non-aligned barrier.sync is not supported", text);
    if ((in->op == OP_LD || in->op == OP_ST) && in->space == SP_NONE)
        return fail(ps, line, "`%s`: generic addressing is not supported (name .global, .shared or .param)", text);
    if (in->op == OP_ST && in->space == SP_PARAM)
        return fail(ps, line, "`%s`: stores to parameters are not supported", text);
    if (in->op == OP_CVTA && (!to || in->space != SP_GLOBAL))
        return fail(ps, line, "`%s`: only cvta.to.global is supported", text);
    return 0;
}

/* Which types each opcode takes. */
static int type_ok(const ptx_instr *in)
{
    const ptx_type t = (ptx_type)in->type;
    const int i32 = t == PT_S32 || t == PT_U32, i64 = t == PT_S64 || t == PT_U64;
    const int i16 = t == PT_S16 || t == PT_U16;
    const int bits = t == PT_B16 || t == PT_B32 || t == PT_B64 || t == PT_PRED;
    switch ((ptx_opcode)in->op) {
    case OP_ADD:
    case OP_SUB:
        return (i16 || i32 || i64 || t == PT_F32 || t == PT_F64) && !(in->sat && t != PT_F32 && t != PT_S32);
    case OP_MUL:
    case OP_MAD:
        if (t == PT_F32 || t == PT_F64)
            return in->mode == MUL_NONE;
        return (i16 || i32 || i64) && in->mode != MUL_NONE && !(in->mode == MUL_WIDE && i64);
    case OP_FMA:
        return (t == PT_F32 || t == PT_F64) && in->rnd >= RND_RN && in->rnd <= RND_RP;
    case OP_DIV:
        return i32 || i64 || (t == PT_F32 && (in->approx || (in->rnd >= RND_RN && in->rnd <= RND_RP))) ||
               (t == PT_F64 && in->rnd >= RND_RN && in->rnd <= RND_RP);
    case OP_REM:
        return i32 || i64;
    case OP_NEG:
    case OP_ABS:
        return t == PT_S32 || t == PT_S64 || t == PT_S16 || t == PT_F32 || t == PT_F64;
    case OP_MIN:
    case OP_MAX:
        return i16 || i32 || i64 || t == PT_F32 || t == PT_F64;
    case OP_AND:
    case OP_OR:
    case OP_XOR:
    case OP_NOT:
        return bits;
    case OP_SHL:
        return t == PT_B16 || t == PT_B32 || t == PT_B64;
    case OP_SHR:
        return t == PT_B16 || t == PT_B32 || t == PT_B64 || i16 || i32 || i64;
    case OP_BFI:
        return t == PT_B32 || t == PT_B64;
    case OP_BFE:
        return i32 || i64;
    case OP_MOV:
        return t != PT_F16X2 && t != PT_BF16X2 && t != PT_F16 && t != PT_BF16;
    case OP_CVTA:
        return t == PT_U64;
    case OP_SETP:
        return i16 || i32 || i64 || t == PT_B16 || t == PT_B32 || t == PT_B64 || t == PT_F32 || t == PT_F64;
    case OP_SELP:
        return i16 || i32 || i64 || t == PT_B16 || t == PT_B32 || t == PT_B64 || t == PT_F32 || t == PT_F64;
    case OP_EX2:
    case OP_RSQRT:
    case OP_LG2:
        return t == PT_F32 && in->approx;
    case OP_SQRT:
    case OP_RCP:
        return (t == PT_F32 && (in->approx || (in->rnd >= RND_RN && in->rnd <= RND_RP))) ||
               (t == PT_F64 && in->rnd >= RND_RN && in->rnd <= RND_RP);
    case OP_LD:
    case OP_ST:
        return t != PT_PRED && t != PT_F16X2 && t != PT_BF16X2;
    case OP_SHFL:
        return t == PT_B32;
    case OP_CVT: {
        const ptx_type d = (ptx_type)in->type, s = (ptx_type)in->stype;
        const int dint = !ptx_type_is_float(d) && d != PT_PRED, sint = !ptx_type_is_float(s) && s != PT_PRED;
        if (d == PT_F16X2 || d == PT_BF16X2)
            return s == PT_F32 && in->rnd == RND_RN;
        if (s == PT_F16X2 || s == PT_BF16X2)
            return 0;
        if (dint && sint)
            return in->rnd == RND_NONE && !in->sat;
        if (dint && !sint) /* float to integer: an integer rounding mode */
            return in->rnd >= RND_RNI;
        if (!dint && sint) /* integer to float: a float rounding mode */
            return in->rnd >= RND_RN && in->rnd <= RND_RP;
        /* float to float: narrowing needs a rounding mode; widening none;
         * same size takes an integer rounding or none (.sat/.ftz only) */
        const int db = ptx_type_bytes(d), sb = ptx_type_bytes(s);
        if (db < sb) { /* narrowing to 16 bits is implemented to nearest even, from f32 */
            if (d == PT_F16 || d == PT_BF16)
                return s == PT_F32 && in->rnd == RND_RN;
            return in->rnd >= RND_RN && in->rnd <= RND_RP;
        }
        if (db > sb)
            return in->rnd == RND_NONE;
        return d == s && (in->rnd == RND_NONE || in->rnd >= RND_RNI);
    }
    default:
        return 1;
    }
}

/* ---- operands ------------------------------------------------------- */

static int add_fixup(parser *ps, fbuild *fb, int instr, int operand, const char *name, int64_t addend)
{
    GROW(fb->fix, fb->nfix, fb->capfix);
    fixup *x = &fb->fix[fb->nfix++];
    x->instr = instr;
    x->operand = operand;
    x->addend = addend;
    x->line = ps->tok.line;
    snprintf(x->name, sizeof x->name, "%s", name);
    return 0;
}

/* A register name to its slot; the sink `_` is -1 where allowed. */
static int reg_operand(parser *ps, fbuild *fb, int32_t *slot)
{
    if (is_word(ps, "_")) {
        *slot = -1;
        scan(ps);
        return 0;
    }
    if (ps->tok.kind != 'i' || ps->tok.text[0] != '%')
        return fail(ps, ps->tok.line, "expected a register, found `%s`", ps->tok.text);
    int s = find_reg(fb, ps->tok.text);
    if (s < 0)
        return fail(ps, ps->tok.line, "undeclared register `%s`", ps->tok.text);
    *slot = s;
    scan(ps);
    return 0;
}

static int parse_operand(parser *ps, fbuild *fb, int instr, int index, ptx_operand *o)
{
    memset(o, 0, sizeof *o);
    o->reg = -1;
    int line = ps->tok.line;
    if (accept(ps, '{')) {
        o->kind = OPD_VEC;
        do {
            if (o->nvec == 4)
                return fail(ps, line, "a vector operand has at most 4 elements");
            if (reg_operand(ps, fb, &o->vec[o->nvec]))
                return -1;
            o->nvec++;
        } while (accept(ps, ','));
        return expect(ps, '}', "} closing a vector");
    }
    if (accept(ps, '[')) {
        o->kind = OPD_MEM;
        if (ps->tok.kind == 'i' && ps->tok.text[0] == '%') {
            if (reg_operand(ps, fb, &o->reg))
                return -1;
        } else if (ps->tok.kind == 'i') {
            if (add_fixup(ps, fb, instr, index, ps->tok.text, 0))
                return -1;
            scan(ps);
        } else if (ps->tok.kind == 'n') {
            int isf;
            if (parse_number(ps->tok.text, &o->imm, &isf) || isf)
                return fail(ps, line, "bad address `%s`", ps->tok.text);
            scan(ps);
        } else {
            return fail(ps, line, "bad address operand `%s`", ps->tok.text);
        }
        if (accept(ps, '+')) {
            int neg = accept(ps, '-');
            int64_t v;
            int isf;
            if (ps->tok.kind != 'n' || parse_number(ps->tok.text, &v, &isf) || isf)
                return fail(ps, line, "bad address offset `%s`", ps->tok.text);
            scan(ps);
            o->imm += neg ? -v : v;
        } else if (accept(ps, '-')) {
            int64_t v;
            int isf;
            if (ps->tok.kind != 'n' || parse_number(ps->tok.text, &v, &isf) || isf)
                return fail(ps, line, "bad address offset `%s`", ps->tok.text);
            scan(ps);
            o->imm -= v;
        }
        return expect(ps, ']', "] closing an address");
    }
    if (accept(ps, '!')) {
        o->neg = 1;
        o->kind = OPD_REG;
        return reg_operand(ps, fb, &o->reg);
    }
    int neg = accept(ps, '-');
    if (ps->tok.kind == 'n') {
        int isf;
        if (parse_number(ps->tok.text, &o->imm, &isf))
            return fail(ps, line, "bad number `%s`", ps->tok.text);
        o->kind = OPD_IMM;
        o->nvec = (uint8_t)isf; /* 0 integer, 32 or 64: a float literal's width */
        if (neg) {
            if (isf == 32)
                o->imm ^= 0x80000000ll;
            else if (isf == 64)
                o->imm ^= (int64_t)0x8000000000000000ull;
            else
                o->imm = -o->imm;
        }
        scan(ps);
        return 0;
    }
    if (neg)
        return fail(ps, line, "`-` before `%s`", ps->tok.text);
    if (ps->tok.kind == 'i' && ps->tok.text[0] == '%') {
        int sr = special_reg(ps->tok.text);
        if (sr >= 0) {
            o->kind = OPD_SPECIAL;
            o->reg = sr;
            scan(ps);
            return 0;
        }
        o->kind = OPD_REG;
        if (reg_operand(ps, fb, &o->reg))
            return -1;
        if (accept(ps, '|')) { /* setp p|q and shfl d|p: the second destination */
            o->nvec = 1;
            return reg_operand(ps, fb, &o->vec[0]);
        }
        return 0;
    }
    if (ps->tok.kind == 'i') {
        /* A label or a variable's address, resolved at the function's end. */
        o->kind = OPD_IMM;
        if (add_fixup(ps, fb, instr, index, ps->tok.text, 0))
            return -1;
        scan(ps);
        return 0;
    }
    return fail(ps, line, "unexpected `%s` in an operand", ps->tok.text);
}

/* Operand counts by opcode, after decoding (shape checks). */
static int check_shape(parser *ps, const ptx_instr *in, int line)
{
    int want = -1;
    switch ((ptx_opcode)in->op) {
    case OP_CVT:
        want = in->type == PT_F16X2 || in->type == PT_BF16X2 ? 3 : 2;
        break;
    case OP_MOV: case OP_NEG: case OP_ABS: case OP_NOT: case OP_CVTA: case OP_EX2:
    case OP_RSQRT: case OP_SQRT: case OP_RCP: case OP_LG2: case OP_LD: case OP_ST:
        want = 2;
        break;
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: case OP_REM: case OP_MIN: case OP_MAX:
    case OP_AND: case OP_OR: case OP_XOR: case OP_SHL: case OP_SHR:
        want = 3;
        break;
    case OP_MAD: case OP_FMA: case OP_SELP: case OP_BFE:
        want = 4;
        break;
    case OP_BFI: case OP_SHFL:
        want = 5;
        break;
    case OP_SETP:
        want = in->boolop ? 4 : 3;
        break;
    case OP_BRA:
        want = 1;
        break;
    case OP_RET: case OP_EXIT:
        want = 0;
        break;
    case OP_BAR:
        if (in->nops < 1 || in->nops > 2)
            return fail(ps, line, "bar.sync takes a barrier and an optional thread count");
        return 0;
    default:
        break;
    }
    if (want >= 0 && in->nops != want)
        return fail(ps, line, "expected %d operands, found %d", want, in->nops);
    if ((in->op == OP_LD && in->o[1].kind != OPD_MEM) || (in->op == OP_ST && in->o[0].kind != OPD_MEM))
        return fail(ps, line, "a load or store needs an address in [ ]");
    if ((in->op == OP_LD && in->vec > 1 && (in->o[0].kind != OPD_VEC || in->o[0].nvec != in->vec)) ||
        (in->op == OP_ST && in->vec > 1 && (in->o[1].kind != OPD_VEC || in->o[1].nvec != in->vec)))
        return fail(ps, line, "a .v%d access needs a vector of %d registers", in->vec, in->vec);
    if (in->op == OP_MOV && in->o[0].kind == OPD_VEC)
        return fail(ps, line, "unpacking mov is not supported");
    if (in->op == OP_MOV && in->o[1].kind == OPD_VEC) {
        int part = ptx_type_bytes((ptx_type)in->type) / in->o[1].nvec;
        if (part < 1 || part * in->o[1].nvec != ptx_type_bytes((ptx_type)in->type) || in->o[1].vec[0] < 0)
            return fail(ps, line, "bad packing mov");
    }
    if (in->op != OP_ST && in->op != OP_BRA && in->op != OP_BAR && in->nops > 0 && in->o[0].kind != OPD_REG &&
        !(in->op == OP_LD && in->o[0].kind == OPD_VEC))
        return fail(ps, line, "the destination must be a register");
    return 0;
}

/* ---- function bodies ------------------------------------------------ */

static int parse_reg_decl(parser *ps, fbuild *fb)
{
    int line = ps->tok.line;
    scan(ps); /* .reg */
    if (ps->tok.kind != 'i' || ps->tok.text[0] != '.' || type_from(ps->tok.text + 1) == PT_NONE)
        return fail(ps, line, "`.reg` needs a type, found `%s`", ps->tok.text);
    ptx_type t = type_from(ps->tok.text + 1);
    scan(ps);
    do {
        if (ps->tok.kind != 'i' || ps->tok.text[0] != '%')
            return fail(ps, line, "bad register name `%s`", ps->tok.text);
        GROW(fb->regs, fb->nregs, fb->capregs);
        reg_decl *d = &fb->regs[fb->nregs];
        snprintf(d->prefix, sizeof d->prefix, "%s", ps->tok.text);
        d->type = t;
        d->base = fb->f->nregs;
        d->count = -1;
        scan(ps);
        if (accept(ps, '<')) {
            int64_t n;
            if (ps->tok.kind != 'n' || parse_int_text(ps->tok.text, &n) || n < 0 || n > 65536)
                return fail(ps, line, "bad register count `%s`", ps->tok.text);
            scan(ps);
            if (expect(ps, '>', ">"))
                return -1;
            d->count = (int32_t)n;
        }
        if (find_reg(fb, d->prefix) >= 0 && d->count < 0)
            return fail(ps, line, "register `%s` declared twice", d->prefix);
        fb->f->nregs += d->count < 0 ? 1 : d->count;
        if (fb->f->nregs > 1 << 20)
            return fail(ps, line, "too many registers");
        fb->nregs++;
    } while (accept(ps, ','));
    return expect(ps, ';', ";");
}

/* A float literal takes the width of the type it is used as: 0f (f32) in
 * an f64 instruction is widened, a decimal or 0d literal in an f32 one is
 * rounded to f32. */
static void normalise_literals(ptx_instr *in)
{
    const ptx_type t = in->op == OP_CVT ? (ptx_type)in->stype : (ptx_type)in->type;
    for (int i = 0; i < in->nops; i++) {
        ptx_operand *o = &in->o[i];
        if (o->kind != OPD_IMM || !o->nvec)
            continue;
        if (t == PT_F32 && o->nvec == 64) {
            double d;
            memcpy(&d, &o->imm, 8);
            float f = (float)d;
            uint32_t b;
            memcpy(&b, &f, 4);
            o->imm = b;
        } else if (t == PT_F64 && o->nvec == 32) {
            uint32_t b = (uint32_t)o->imm;
            float f;
            memcpy(&f, &b, 4);
            double d = f;
            memcpy(&o->imm, &d, 8);
        }
        o->nvec = 0;
    }
}

static int parse_instruction(parser *ps, fbuild *fb)
{
    ptx_function *f = fb->f;
    GROW(f->code, f->ncode, fb->capcode);
    ptx_instr *in = &f->code[f->ncode];
    memset(in, 0, sizeof *in);
    in->guard = -1;
    in->reconv = -1;
    in->line = ps->tok.line;
    if (accept(ps, '@')) {
        in->guard_neg = (uint8_t)accept(ps, '!');
        if (reg_operand(ps, fb, &in->guard) || in->guard < 0)
            return fail(ps, in->line, "bad guard predicate");
    }
    if (ps->tok.kind != 'i')
        return fail(ps, in->line, "expected an instruction, found `%s`", ps->tok.text);
    char opname[256];
    snprintf(opname, sizeof opname, "%s", ps->tok.text);
    if (decode_opcode(ps, opname, in, in->line))
        return -1;
    scan(ps);
    while (ps->tok.kind != ';') {
        if (in->nops == 5)
            return fail(ps, in->line, "too many operands");
        if (parse_operand(ps, fb, f->ncode, in->nops, &in->o[in->nops]))
            return -1;
        in = &f->code[f->ncode]; /* (fixups may not move code, but stay safe) */
        in->nops++;
        if (!accept(ps, ','))
            break;
    }
    if (expect(ps, ';', "; ending the instruction"))
        return -1;
    if (!type_ok(in))
        return fail(ps, in->line, "`%s` is not supported by the simulator (type or modifiers)", opname);
    normalise_literals(in);
    if (check_shape(ps, in, in->line))
        return -1;
    f->ncode++;
    return 0;
}

static int resolve(parser *ps, fbuild *fb)
{
    ptx_function *f = fb->f;
    for (int i = 0; i < fb->nfix; i++) {
        fixup *x = &fb->fix[i];
        ptx_instr *in = &f->code[x->instr];
        ptx_operand *o = &in->o[x->operand];
        if (in->op == OP_BRA) {
            int k;
            for (k = 0; k < fb->nlabels; k++)
                if (!strcmp(fb->labels[k].name, x->name))
                    break;
            if (k == fb->nlabels)
                return fail(ps, x->line, "unknown label `%s`", x->name);
            o->kind = OPD_LABEL;
            o->imm = fb->labels[k].at;
            continue;
        }
        const symbol *s = find_symbol(fb, x->name);
        if (!s)
            return fail(ps, x->line, "unknown symbol `%s`", x->name);
        int64_t v;
        ptx_space sp;
        switch (s->kind) {
        case SYM_PARAM:
            v = s->value, sp = SP_PARAM;
            break;
        case SYM_SHARED:
            v = s->value, sp = SP_SHARED;
            break;
        case SYM_DYNSHARED:
            v = align_up(f->static_shared, f->dynamic_align), sp = SP_SHARED;
            break;
        default:
            v = (int64_t)(uintptr_t)ps->m->globals[s->value].data, sp = SP_GLOBAL;
            break;
        }
        if (o->kind == OPD_MEM) {
            if (in->space != sp)
                return fail(ps, x->line, "`%s` is not in the instruction's state space", x->name);
            o->imm += v;
        } else {
            if (in->op != OP_MOV && in->op != OP_CVTA)
                return fail(ps, x->line, "a symbol address is only supported in mov and cvta");
            o->imm = v + x->addend;
        }
    }
    for (int i = 0; i < f->ncode; i++) {
        if (f->code[i].op != OP_BRA)
            continue;
        if (f->code[i].o[0].kind != OPD_LABEL)
            return fail(ps, f->code[i].line, "a branch needs a label");
    }
    return 0;
}

static int parse_params(parser *ps, fbuild *fb)
{
    ptx_function *f = fb->f;
    int cap = 0;
    if (expect(ps, '(', "( opening the parameter list"))
        return -1;
    if (accept(ps, ')'))
        return 0;
    do {
        int line = ps->tok.line;
        if (!is_word(ps, ".param"))
            return fail(ps, line, "expected .param, found `%s`", ps->tok.text);
        scan(ps);
        var_decl v;
        int64_t align = 0;
        ptx_type t = PT_NONE;
        char name[256] = "";
        int64_t size = 0;
        /* like parse_var_decl, without the ';' */
        for (;;) {
            if (is_word(ps, ".align")) {
                scan(ps);
                if (ps->tok.kind != 'n' || parse_int_text(ps->tok.text, &align) || align < 1 || align > 256)
                    return fail(ps, line, "bad .align");
                scan(ps);
            } else if (ps->tok.kind == 'i' && ps->tok.text[0] == '.' && type_from(ps->tok.text + 1) != PT_NONE) {
                t = type_from(ps->tok.text + 1);
                scan(ps);
            } else if (ps->tok.kind == 'i' && ps->tok.text[0] == '.') {
                return fail(ps, line, "parameter attribute `%s` is not supported", ps->tok.text);
            } else {
                break;
            }
        }
        (void)v;
        if (t == PT_NONE || t == PT_PRED || ps->tok.kind != 'i')
            return fail(ps, line, "bad parameter declaration");
        snprintf(name, sizeof name, "%s", ps->tok.text);
        scan(ps);
        size = ptx_type_bytes(t);
        if (accept(ps, '[')) {
            int64_t n;
            if (ps->tok.kind != 'n' || parse_int_text(ps->tok.text, &n) || n < 1 || n > 32764)
                return fail(ps, line, "bad parameter array size");
            scan(ps);
            if (expect(ps, ']', "]"))
                return -1;
            size *= n;
        }
        if (!align)
            align = ptx_type_bytes(t);
        GROW(f->params, f->nparams, cap);
        ptx_param *pp = &f->params[f->nparams++];
        pp->align = align;
        pp->size = size;
        pp->offset = align_up(f->param_bytes, align);
        f->param_bytes = pp->offset + size;
        if (f->param_bytes > 32764)
            return fail(ps, line, "parameters exceed 32764 bytes");
        if (add_symbol(ps, fb, name, SYM_PARAM, pp->offset))
            return -1;
    } while (accept(ps, ','));
    return expect(ps, ')', ") closing the parameter list");
}

static void fbuild_free(fbuild *fb)
{
    free(fb->regs);
    free(fb->syms);
    free(fb->fix);
    free(fb->labels);
}

static int parse_entry(parser *ps, mbuild *mb)
{
    ptx_module *m = ps->m;
    int line = ps->tok.line;
    scan(ps); /* .entry */
    if (ps->tok.kind != 'i')
        return fail(ps, line, "expected the entry's name");
    if (m->nfuncs >= mb->capfuncs) {
        int nc = mb->capfuncs ? 2 * mb->capfuncs : 4;
        void *np = realloc(m->funcs, (size_t)nc * sizeof *m->funcs);
        if (!np)
            return fail(ps, line, "out of memory");
        m->funcs = np;
        mb->capfuncs = nc;
    }
    ptx_function *f = &m->funcs[m->nfuncs++];
    memset(f, 0, sizeof *f);
    f->name = strdup(ps->tok.text);
    f->lines = m->lines;
    f->static_shared = mb->shared_bytes;
    f->dynamic_align = mb->dyn_align ? mb->dyn_align : 16;
    if (!f->name)
        return fail(ps, line, "out of memory");
    scan(ps);
    fbuild fb = {.f = f};
    int rc = -1;
    /* Module-scope variables are visible in every function. */
    for (int i = 0; i < mb->nsyms; i++)
        if (add_symbol(ps, &fb, mb->syms[i].name, mb->syms[i].kind, mb->syms[i].value))
            goto done;
    if (mb->dyn_name[0]) {
        fb.has_dynamic = 1;
        if (add_symbol(ps, &fb, mb->dyn_name, SYM_DYNSHARED, 0))
            goto done;
    }
    if (parse_params(ps, &fb))
        goto done;
    /* Performance directives before the body. */
    while (ps->tok.kind == 'i' && ps->tok.text[0] == '.') {
        int dl = ps->tok.line;
        if (is_word(ps, ".maxntid") || is_word(ps, ".reqntid")) {
            scan(ps);
            int64_t prod = 1;
            do {
                int64_t v;
                if (ps->tok.kind != 'n' || parse_int_text(ps->tok.text, &v) || v < 1 || v > 1024)
                    return fail(ps, dl, "bad thread count");
                prod *= v;
                scan(ps);
            } while (accept(ps, ','));
            f->maxntid = (int32_t)(prod > 1024 ? 1024 : prod);
        } else if (is_word(ps, ".minnctapersm") || is_word(ps, ".maxnreg") || is_word(ps, ".maxnctapersm")) {
            scan(ps);
            if (ps->tok.kind != 'n')
                return fail(ps, dl, "bad directive value");
            scan(ps);
        } else if (is_word(ps, ".noreturn")) {
            scan(ps);
        } else {
            fail(ps, dl, "directive `%s` is not supported", ps->tok.text);
            goto done;
        }
    }
    if (expect(ps, '{', "{ opening the body"))
        goto done;
    int depth = 1;
    while (!ps->failed) {
        if (ps->tok.kind == 0) {
            fail(ps, ps->tok.line, "the body of %s does not end", f->name);
            break;
        }
        if (accept(ps, '{')) {
            depth++;
            continue;
        }
        if (ps->tok.kind == '}') {
            scan(ps);
            if (--depth == 0)
                break;
            continue;
        }
        if (is_word(ps, ".reg")) {
            parse_reg_decl(ps, &fb);
        } else if (is_word(ps, ".shared")) {
            int dl = ps->tok.line;
            scan(ps);
            var_decl v;
            if (parse_var_decl(ps, &v, 0))
                break;
            if (v.is_array_unsized) {
                fail(ps, dl, "an unsized .shared array inside a function is not supported");
                break;
            }
            int64_t off = align_up(f->static_shared, v.align);
            f->static_shared = off + v.size;
            if (add_symbol(ps, &fb, v.name, SYM_SHARED, off))
                break;
        } else if (is_word(ps, ".pragma")) {
            scan(ps);
            while (ps->tok.kind == 's' || accept(ps, ','))
                if (ps->tok.kind == 's')
                    scan(ps);
            expect(ps, ';', ";");
        } else if (ps->tok.kind == 'i' && ps->tok.text[0] == '.') {
            fail(ps, ps->tok.line, "directive `%s` is not supported inside a function", ps->tok.text);
        } else if (ps->tok.kind == 'i' && ps->tok.text[0] != '%') {
            /* a label, or an instruction */
            const char *save_p = ps->p;
            int save_line = ps->line;
            token save_tok = ps->tok;
            scan(ps);
            if (ps->tok.kind == ':') {
                if (fb.nlabels >= fb.caplabels) {
                    int nc = fb.caplabels ? 2 * fb.caplabels : 16;
                    void *np = realloc(fb.labels, (size_t)nc * sizeof *fb.labels);
                    if (!np) {
                        fail(ps, save_tok.line, "out of memory");
                        break;
                    }
                    fb.labels = np;
                    fb.caplabels = nc;
                }
                snprintf(fb.labels[fb.nlabels].name, sizeof fb.labels[0].name, "%s", save_tok.text);
                fb.labels[fb.nlabels++].at = f->ncode;
                scan(ps);
            } else {
                ps->p = save_p;
                ps->line = save_line;
                ps->tok = save_tok;
                parse_instruction(ps, &fb);
            }
        } else if (ps->tok.kind == '@') {
            parse_instruction(ps, &fb);
        } else {
            fail(ps, ps->tok.line, "unexpected `%s`", ps->tok.text);
        }
    }
    if (ps->failed)
        goto done;
    if (f->static_shared > 227 * 1024) {
        fail(ps, line, "%s declares %lld bytes of static shared memory", f->name, (long long)f->static_shared);
        goto done;
    }
    /* A body that runs off its end returns, as ptxas requires a ret. */
    if (f->ncode == 0 || (f->code[f->ncode - 1].op != OP_RET && f->code[f->ncode - 1].op != OP_EXIT &&
                          !(f->code[f->ncode - 1].op == OP_BRA && f->code[f->ncode - 1].guard < 0))) {
        GROW(f->code, f->ncode, fb.capcode);
        ptx_instr *r = &f->code[f->ncode++];
        memset(r, 0, sizeof *r);
        r->op = OP_RET;
        r->guard = -1;
        r->reconv = -1;
        r->line = ps->tok.line;
    }
    if (resolve(ps, &fb))
        goto done;
    rc = ptx_reconvergence(f, ps->err, ps->errlen);
    if (rc)
        ps->failed = 1;
done:
    fbuild_free(&fb);
    return ps->failed ? -1 : rc;
}

/* ---- the module ------------------------------------------------------ */

static int add_global(parser *ps, mbuild *mb, var_decl *v)
{
    ptx_module *m = ps->m;
    if (m->nglobals >= mb->capglobals) {
        int nc = mb->capglobals ? 2 * mb->capglobals : 8;
        void *np = realloc(m->globals, (size_t)nc * sizeof *m->globals);
        if (!np)
            return fail(ps, ps->tok.line, "out of memory");
        m->globals = np;
        mb->capglobals = nc;
    }
    ptx_global *g = &m->globals[m->nglobals];
    g->name = strdup(v->name);
    g->size = v->size;
    int64_t bytes = align_up(v->size ? v->size : 1, 16);
    g->data = aligned_alloc(v->align > 16 ? (size_t)v->align : 16, (size_t)bytes);
    if (!g->name || !g->data) {
        free(g->name);
        free(g->data);
        return fail(ps, ps->tok.line, "out of memory");
    }
    memset(g->data, 0, (size_t)bytes);
    if (v->init)
        memcpy(g->data, v->init, (size_t)v->size);
    m->nglobals++;
    return push_symbol(ps, &mb->syms, &mb->nsyms, &mb->capsyms, v->name, SYM_GLOBAL, m->nglobals - 1);
}

static int add_module_shared(parser *ps, mbuild *mb, var_decl *v, int is_extern)
{
    if (is_extern) {
        if (!v->is_array_unsized)
            return fail(ps, ps->tok.line, "an .extern .shared variable must be an unsized array");
        snprintf(mb->dyn_name, sizeof mb->dyn_name, "%s", v->name);
        mb->dyn_align = v->align;
        return 0;
    }
    int64_t off = align_up(mb->shared_bytes, v->align);
    if (push_symbol(ps, &mb->syms, &mb->nsyms, &mb->capsyms, v->name, SYM_SHARED, off))
        return -1;
    mb->shared_bytes = off + v->size;
    return 0;
}

static int split_lines(ptx_module *m, const char *text)
{
    m->text = strdup(text);
    if (!m->text)
        return -1;
    int n = 2;
    for (const char *c = text; *c; c++)
        n += *c == '\n';
    m->lines = calloc((size_t)n, sizeof *m->lines);
    if (!m->lines)
        return -1;
    m->lines[0] = "";
    int k = 1;
    char *p = m->text;
    m->lines[k++] = p;
    for (; *p; p++)
        if (*p == '\n') {
            *p = 0;
            m->lines[k++] = p + 1;
        }
    m->nlines = k - 1;
    return 0;
}

const char *ptx_line_text(const ptx_function *f, int line)
{
    if (!f->lines || line < 1)
        return "";
    const char *s = f->lines[line];
    if (!s)
        return "";
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

void ptx_module_free(ptx_module *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nfuncs; i++) {
        free(m->funcs[i].name);
        free(m->funcs[i].code);
        free(m->funcs[i].params);
    }
    for (int i = 0; i < m->nglobals; i++) {
        free(m->globals[i].name);
        free(m->globals[i].data);
    }
    free(m->funcs);
    free(m->globals);
    free(m->text);
    free(m->lines);
    free(m);
}

int ptx_parse(const char *text, ptx_module **out, char *err, size_t errlen)
{
    *out = NULL;
    ptx_module *m = calloc(1, sizeof *m);
    if (!m || split_lines(m, text)) {
        snprintf(err, errlen, "out of memory");
        ptx_module_free(m);
        return -1;
    }
    parser ps = {.p = text, .line = 1, .err = err, .errlen = errlen, .m = m};
    mbuild mb = {0};
    int seen_version = 0, seen_target = 0;
    scan(&ps);
    while (!ps.failed && ps.tok.kind != 0) {
        int line = ps.tok.line;
        if (is_word(&ps, ".version")) {
            scan(&ps);
            double v = strtod(ps.tok.text, NULL);
            if (ps.tok.kind != 'n' || v < 6.0 || v > 9.2) {
                fail(&ps, line, "PTX ISA version `%s` is not supported (6.0 to 9.2)", ps.tok.text);
                break;
            }
            seen_version = 1;
            scan(&ps);
        } else if (is_word(&ps, ".target")) {
            scan(&ps);
            for (;;) {
                if (ps.tok.kind != 'i' || ps.tok.line != line) {
                    fail(&ps, line, "bad .target");
                    break;
                }
                if (!strncmp(ps.tok.text, "sm_", 3)) {
                    char *end;
                    long cc = strtol(ps.tok.text + 3, &end, 10);
                    if (cc < 70 || (*end && strcmp(end, "a"))) {
                        fail(&ps, line, "target `%s` is not supported (sm_70 to sm_90)", ps.tok.text);
                        break;
                    }
                    m->target = (int)cc;
                } else if (strcmp(ps.tok.text, "texmode_independent") && strcmp(ps.tok.text, "texmode_unified")) {
                    fail(&ps, line, "target option `%s` is not supported", ps.tok.text);
                    break;
                }
                scan(&ps);
                if (!accept(&ps, ','))
                    break;
            }
            seen_target = 1;
        } else if (is_word(&ps, ".address_size")) {
            scan(&ps);
            if (strcmp(ps.tok.text, "64")) {
                fail(&ps, line, ".address_size %s is not supported (64 only)", ps.tok.text);
                break;
            }
            scan(&ps);
        } else if (is_word(&ps, ".global") || is_word(&ps, ".shared") || is_word(&ps, ".extern")) {
            int is_extern = is_word(&ps, ".extern");
            if (is_extern)
                scan(&ps);
            if (is_word(&ps, ".func") || is_word(&ps, ".entry")) {
                fail(&ps, line, "external functions (`%s`) are not supported", ps.tok.text);
                break;
            }
            int shared = is_word(&ps, ".shared");
            if (!shared && !is_word(&ps, ".global")) {
                fail(&ps, line, "`.extern %s` is not supported", ps.tok.text);
                break;
            }
            scan(&ps);
            var_decl v;
            if (parse_var_decl(&ps, &v, !shared)) {
                free(v.init);
                break;
            }
            int rc = shared ? add_module_shared(&ps, &mb, &v, is_extern) : add_global(&ps, &mb, &v);
            free(v.init);
            if (rc)
                break;
        } else if (is_word(&ps, ".visible") || is_word(&ps, ".weak")) {
            scan(&ps);
        } else if (is_word(&ps, ".entry")) {
            if (!seen_version || !seen_target) {
                fail(&ps, line, "an entry before .version and .target");
                break;
            }
            if (parse_entry(&ps, &mb))
                break;
        } else if (is_word(&ps, ".func")) {
            fail(&ps, line, "device functions (.func) are not supported; the kernels must be fully inlined");
        } else {
            fail(&ps, line, "unknown or unsupported directive `%s`", ps.tok.text);
        }
    }
    free(mb.syms);
    if (!ps.failed && !seen_version)
        fail(&ps, 1, "no .version directive");
    if (ps.failed) {
        ptx_module_free(m);
        return -1;
    }
    *out = m;
    return 0;
}
