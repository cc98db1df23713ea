/*
 * ptx.h - a PTX module parsed and decoded for the interpreter.
 *
 * ptx_parse() turns the text NVRTC emits into one array of decoded
 * instructions per entry function: operands resolved to register slots,
 * immediates, labels (instruction indices) and symbol addresses. Anything
 * the simulator does not implement (an opcode, a type, a modifier, a
 * directive) fails the parse with a message naming it and its line, so a
 * kernel never runs with an instruction half understood.
 */
#ifndef CUDASIM_PTX_H
#define CUDASIM_PTX_H

#include <stddef.h>
#include <stdint.h>

/* Value types. Registers hold every type in a 64-bit slot. */
typedef enum ptx_type {
    PT_NONE = 0,
    PT_PRED,
    PT_B8, PT_B16, PT_B32, PT_B64,
    PT_U8, PT_U16, PT_U32, PT_U64,
    PT_S8, PT_S16, PT_S32, PT_S64,
    PT_F16, PT_F16X2, PT_BF16, PT_BF16X2, PT_F32, PT_F64,
} ptx_type;

/* Bytes of a value of the type (a predicate counts one). Inline: the
 * interpreter asks on every instruction. */
static inline int ptx_type_bytes(ptx_type t)
{
    static const int8_t bytes[] = {
        [PT_NONE] = 0, [PT_PRED] = 1,  [PT_B8] = 1,   [PT_B16] = 2,    [PT_B32] = 4, [PT_B64] = 8,  [PT_U8] = 1,
        [PT_U16] = 2,  [PT_U32] = 4,   [PT_U64] = 8,  [PT_S8] = 1,     [PT_S16] = 2, [PT_S32] = 4,  [PT_S64] = 8,
        [PT_F16] = 2,  [PT_F16X2] = 4, [PT_BF16] = 2, [PT_BF16X2] = 4, [PT_F32] = 4, [PT_F64] = 8,
    };
    return (unsigned)t < sizeof bytes ? bytes[t] : 0;
}
int ptx_type_is_signed(ptx_type t);
int ptx_type_is_float(ptx_type t);
const char *ptx_type_name(ptx_type t);

typedef enum ptx_opcode {
    OP_MOV, OP_ADD, OP_SUB, OP_MUL, OP_MAD, OP_FMA, OP_DIV, OP_REM, OP_NEG, OP_ABS,
    OP_MIN, OP_MAX, OP_AND, OP_OR, OP_XOR, OP_NOT, OP_SHL, OP_SHR, OP_BFI, OP_BFE,
    OP_CVT, OP_CVTA, OP_SETP, OP_SELP, OP_EX2, OP_RSQRT, OP_SQRT, OP_RCP, OP_LG2,
    OP_LD, OP_ST, OP_SHFL, OP_BAR, OP_BRA, OP_RET, OP_EXIT,
    OP_COUNT
} ptx_opcode;

/* Rounding modifiers; the integer forms (.rni ...) round to an integer. */
typedef enum ptx_round {
    RND_NONE = 0, RND_RN, RND_RZ, RND_RM, RND_RP, RND_RNI, RND_RZI, RND_RMI, RND_RPI,
} ptx_round;

typedef enum ptx_cmp {
    CMP_EQ, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_LO, CMP_LS, CMP_HI, CMP_HS,
    CMP_EQU, CMP_NEU, CMP_LTU, CMP_LEU, CMP_GTU, CMP_GEU, CMP_NUM, CMP_NAN,
} ptx_cmp;

typedef enum ptx_space { SP_NONE = 0, SP_GLOBAL, SP_SHARED, SP_PARAM } ptx_space;

typedef enum ptx_shfl_mode { SHFL_UP, SHFL_DOWN, SHFL_BFLY, SHFL_IDX } ptx_shfl_mode;

/* Integer multiply forms. */
typedef enum ptx_mulmode { MUL_NONE = 0, MUL_LO, MUL_HI, MUL_WIDE } ptx_mulmode;

typedef enum ptx_operand_kind {
    OPD_NONE = 0,
    OPD_REG,     /* reg: slot */
    OPD_IMM,     /* imm: the bits (float literals already in their format) */
    OPD_SPECIAL, /* reg: which special register (PTX_SR_*) */
    OPD_VEC,     /* vec[0..nvec-1]: slots; -1 is the sink `_` */
    OPD_MEM,     /* [reg + imm] or [imm] (reg = -1) */
    OPD_LABEL,   /* imm: instruction index */
} ptx_operand_kind;

enum {
    PTX_SR_TID_X, PTX_SR_TID_Y, PTX_SR_TID_Z, PTX_SR_NTID_X, PTX_SR_NTID_Y, PTX_SR_NTID_Z,
    PTX_SR_CTAID_X, PTX_SR_CTAID_Y, PTX_SR_CTAID_Z, PTX_SR_NCTAID_X, PTX_SR_NCTAID_Y, PTX_SR_NCTAID_Z,
    PTX_SR_LANEID, PTX_SR_WARPID,
};

typedef struct ptx_operand {
    uint8_t kind;
    uint8_t nvec;
    uint8_t neg; /* `!%p` in setp/selp predicate inputs */
    int32_t reg;
    int64_t imm;
    int32_t vec[4];
} ptx_operand;

typedef struct ptx_instr {
    uint8_t op;        /* ptx_opcode */
    uint8_t type;      /* the instruction type (destination for cvt) */
    uint8_t stype;     /* cvt: the source type */
    uint8_t rnd;       /* ptx_round */
    uint8_t ftz, sat, approx, nc, uni;
    uint8_t cmp;       /* setp */
    uint8_t boolop;    /* setp combine: 0 none, 1 and, 2 or, 3 xor */
    uint8_t space;     /* ld/st/cvta */
    uint8_t vec;       /* ld/st: 1, 2 or 4 */
    uint8_t mode;      /* shfl mode or mul mode */
    uint8_t nops;
    int32_t guard;     /* predicate slot, -1 when unguarded */
    uint8_t guard_neg;
    int32_t reconv;    /* bra: where diverged lanes meet again; -1 at exit */
    int32_t line;      /* PTX source line */
    ptx_operand o[5];
} ptx_instr;

typedef struct ptx_param {
    int64_t offset, size, align;
} ptx_param;

typedef struct ptx_function {
    char *name;
    ptx_instr *code;
    int32_t ncode;
    int32_t nregs;       /* register slots */
    ptx_param *params;
    int32_t nparams;
    int64_t param_bytes;
    int64_t static_shared; /* bytes of .shared declared in and for the function */
    int64_t dynamic_align; /* alignment of the .extern .shared window */
    int32_t maxntid;       /* product of .maxntid, 0 when absent */
    char **lines;          /* source line text by line number (shared) */
} ptx_function;

typedef struct ptx_global {
    char *name;
    uint8_t *data;
    int64_t size;
} ptx_global;

typedef struct ptx_module {
    ptx_function *funcs;
    int nfuncs;
    ptx_global *globals;  /* .global variables: host memory the module owns */
    int nglobals;
    int target;           /* 90 for .target sm_90 */
    char *text;           /* a copy of the source, split into lines */
    char **lines;
    int nlines;
} ptx_module;

/* Parses text (NUL-terminated). On failure returns -1 with "line N: ..." in
 * err; on success 0 and *out (free with ptx_module_free). */
int ptx_parse(const char *text, ptx_module **out, char *err, size_t errlen);
void ptx_module_free(ptx_module *m);

/* Computes every branch's reconvergence point (immediate post-dominator). */
int ptx_reconvergence(ptx_function *f, char *err, size_t errlen);

/* The PTX text of line n (without leading blanks), for messages. */
const char *ptx_line_text(const ptx_function *f, int line);

#endif
