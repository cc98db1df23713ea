/*
 * sim_exec.c - the interpreter (see sim_exec.h).
 *
 * Registers live in one array per warp, slot-major (regs[slot * 32 + lane])
 * so that an instruction is one loop over the active lanes. A warp's SIMT
 * stack holds (pc, reconvergence pc, lanes) entries: at a branch the lanes
 * disagree on, the entry continues at the reconvergence point and the two
 * sides are pushed above it (ptx_cfg.c finds the points). Built with
 * -frounding-math and -ffp-contract=off: each C float operation here is the
 * one IEEE operation the PTX instruction names.
 */
#define _GNU_SOURCE
#include "sim_exec.h"

#include <math.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ptx_numerics.h"

enum {
    CU_ILLEGAL_ADDRESS = 700,
    CU_LAUNCH_TIMEOUT = 702,
    CU_ILLEGAL_INSTRUCTION = 715,
    CU_MISALIGNED_ADDRESS = 716,
    CU_LAUNCH_FAILED = 719,
};

/* Warp-level instructions one block may issue before it is presumed hung. */
#define SIM_BLOCK_BUDGET (1ll << 30)
#define SIM_STACK_MAX 256

typedef struct simt_entry {
    int32_t pc, rpc;
    uint32_t mask;
} simt_entry;

enum { WARP_RUNNING, WARP_AT_BARRIER, WARP_DONE };

typedef struct warp {
    int index;
    uint32_t live; /* lanes that exist and have not exited */
    int state;
    int bar_id, bar_count, bar_pc;
    int nstack;
    simt_entry stack[SIM_STACK_MAX];
    uint64_t *regs;
} warp;

/* Distinct 32-byte sectors of a launch, with what touched them. */
typedef struct sector_set {
    uint64_t *keys;    /* sector index + 1; 0 is empty */
    uint8_t *flags;    /* 1 read, 2 written */
    uint32_t *written; /* the bytes of the sector this launch wrote */
    size_t cap, n;
} sector_set;

typedef struct block_ctx {
    const sim_launch *l;
    const ptx_function *f;
    unsigned cta[3];
    int nthreads, nwarps;
    warp *warps;
    uint8_t *shared;
    int64_t shared_bytes;
    /* shared-memory shadow: per byte the barrier interval of the last
     * access, its writer and reader (-1 none, -2 several), and whether it
     * was ever written */
    uint32_t *sh_epoch;
    int32_t *sh_writer, *sh_reader;
    uint8_t *sh_init;
    uint32_t epoch;
    int64_t issued;
    sim_result *res;
    sector_set *sectors;
    int faulted;
} block_ctx;

/* ---- faults ---------------------------------------------------------- */

static void thread_coords(const block_ctx *b, int tid, unsigned out[3])
{
    const unsigned bx = b->l->block[0], by = b->l->block[1];
    out[0] = (unsigned)tid % bx;
    out[1] = ((unsigned)tid / bx) % by;
    out[2] = (unsigned)tid / (bx * by);
}

static int fault(block_ctx *b, int code, const warp *w, int lane, const ptx_instr *in, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
static int fault(block_ctx *b, int code, const warp *w, int lane, const ptx_instr *in, const char *fmt, ...)
{
    if (b->faulted)
        return code;
    b->faulted = 1;
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    char where[256] = "";
    if (w && lane >= 0) {
        unsigned t[3];
        thread_coords(b, w->index * 32 + lane, t);
        snprintf(where, sizeof where, ", thread (%u,%u,%u)", t[0], t[1], t[2]);
    } else if (w) {
        snprintf(where, sizeof where, ", warp %d", w->index);
    }
    char line[320] = "";
    if (in)
        snprintf(line, sizeof line, ", PTX line %d `%.200s`", in->line, ptx_line_text(b->f, in->line));
    b->res->code = code;
    snprintf(b->res->message, sizeof b->res->message, "kernel %s, block (%u,%u,%u)%s%s: %s", b->f->name,
             b->cta[0], b->cta[1], b->cta[2], where, line, detail);
    return code;
}

/* ---- traffic --------------------------------------------------------- */

static int sectors_grow(sector_set *s)
{
    size_t nc = s->cap ? 2 * s->cap : 1 << 14;
    uint64_t *nk = calloc(nc, sizeof *nk);
    uint8_t *nf = calloc(nc, 1);
    uint32_t *nw = calloc(nc, sizeof *nw);
    if (!nk || !nf || !nw) {
        free(nk);
        free(nf);
        free(nw);
        return -1;
    }
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->keys[i])
            continue;
        size_t h = (size_t)(s->keys[i] * 0x9e3779b97f4a7c15ull) & (nc - 1);
        while (nk[h])
            h = (h + 1) & (nc - 1);
        nk[h] = s->keys[i];
        nf[h] = s->flags[i];
        nw[h] = s->written[i];
    }
    free(s->keys);
    free(s->flags);
    free(s->written);
    s->keys = nk;
    s->flags = nf;
    s->written = nw;
    s->cap = nc;
    return 0;
}

/* The slot of a sector, or -1 when the launch has not touched it. */
static ptrdiff_t sectors_find(const sector_set *s, uint64_t sector)
{
    if (!s->cap)
        return -1;
    const uint64_t key = sector + 1;
    size_t h = (size_t)(key * 0x9e3779b97f4a7c15ull) & (s->cap - 1);
    while (s->keys[h] && s->keys[h] != key)
        h = (h + 1) & (s->cap - 1);
    return s->keys[h] ? (ptrdiff_t)h : -1;
}

/* The mask of bytes [lo, hi) within one 32-byte sector. */
static uint32_t byte_mask(unsigned lo, unsigned hi)
{
    return (hi >= 32 ? 0xffffffffu : (1u << hi) - 1) & ~((1u << lo) - 1);
}

/* Marks [addr, addr + bytes) written (the sectors were just counted). */
static void sectors_mark_written(sector_set *s, uint64_t addr, int bytes)
{
    for (uint64_t a = addr, end = addr + (uint64_t)bytes; a < end;) {
        const uint64_t sec = a >> 5, next = (sec + 1) << 5, stop = end < next ? end : next;
        const ptrdiff_t h = sectors_find(s, sec);
        if (h >= 0)
            s->written[h] |= byte_mask((unsigned)(a & 31), (unsigned)(stop - (sec << 5)));
        a = stop;
    }
}

/* Whether the launch wrote any byte of [addr, addr + bytes). */
static int sectors_any_written(const sector_set *s, uint64_t addr, int bytes)
{
    for (uint64_t a = addr, end = addr + (uint64_t)bytes; a < end;) {
        const uint64_t sec = a >> 5, next = (sec + 1) << 5, stop = end < next ? end : next;
        const ptrdiff_t h = sectors_find(s, sec);
        if (h >= 0 && (s->written[h] & byte_mask((unsigned)(a & 31), (unsigned)(stop - (sec << 5)))))
            return 1;
        a = stop;
    }
    return 0;
}

static int sectors_add(sector_set *s, uint64_t sector, uint8_t flag)
{
    if (2 * (s->n + 1) > s->cap && sectors_grow(s))
        return -1;
    const uint64_t key = sector + 1;
    size_t h = (size_t)(key * 0x9e3779b97f4a7c15ull) & (s->cap - 1);
    while (s->keys[h] && s->keys[h] != key)
        h = (h + 1) & (s->cap - 1);
    if (!s->keys[h]) {
        s->keys[h] = key;
        s->n++;
    }
    s->flags[h] |= flag;
    return 0;
}

/* Counts one warp-level global request: its bytes and distinct sectors. */
static void count_request(block_ctx *b, const uint64_t *addr, uint32_t mask, int bytes, int is_store)
{
    uint64_t sec[64];
    int n = 0;
    for (uint32_t m = mask; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        const uint64_t s0 = addr[l] >> 5, s1 = (addr[l] + (uint64_t)bytes - 1) >> 5;
        for (uint64_t s = s0; s <= s1 && n < 64; s++) {
            int j = n++;
            while (j > 0 && sec[j - 1] > s) { /* insertion: addresses mostly ascend */
                sec[j] = sec[j - 1];
                j--;
            }
            sec[j] = s;
        }
    }
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        if (i && sec[i] == sec[i - 1])
            continue;
        distinct++;
        if (sectors_add(b->sectors, sec[i], is_store ? 2 : 1) && !b->faulted)
            fault(b, CU_LAUNCH_FAILED, NULL, -1, NULL, "the simulator ran out of memory counting traffic");
    }
    cudasim_traffic *t = &b->res->traffic;
    t->requests++;
    t->sectors += (unsigned long long)distinct;
    t->bytes_requested += (unsigned long long)(__builtin_popcount(mask) * bytes);
}

/* ---- operand access -------------------------------------------------- */

static uint64_t special(const block_ctx *b, const warp *w, int which, int lane)
{
    const int tid = w->index * 32 + lane;
    const sim_launch *l = b->l;
    switch (which) {
    case PTX_SR_TID_X:
        return (unsigned)tid % l->block[0];
    case PTX_SR_TID_Y:
        return ((unsigned)tid / l->block[0]) % l->block[1];
    case PTX_SR_TID_Z:
        return (unsigned)tid / (l->block[0] * l->block[1]);
    case PTX_SR_NTID_X:
    case PTX_SR_NTID_Y:
    case PTX_SR_NTID_Z:
        return l->block[which - PTX_SR_NTID_X];
    case PTX_SR_CTAID_X:
    case PTX_SR_CTAID_Y:
    case PTX_SR_CTAID_Z:
        return b->cta[which - PTX_SR_CTAID_X];
    case PTX_SR_NCTAID_X:
    case PTX_SR_NCTAID_Y:
    case PTX_SR_NCTAID_Z:
        return l->grid[which - PTX_SR_NCTAID_X];
    case PTX_SR_LANEID:
        return (unsigned)lane;
    default:
        return (unsigned)w->index;
    }
}

static inline uint64_t src(const block_ctx *b, const warp *w, const ptx_operand *o, int lane)
{
    switch (o->kind) {
    case OPD_REG:
        return w->regs[(size_t)o->reg * 32 + (size_t)lane];
    case OPD_SPECIAL:
        return special(b, w, o->reg, lane);
    default:
        return (uint64_t)o->imm;
    }
}

static inline void dst(warp *w, const ptx_operand *o, int lane, uint64_t v)
{
    w->regs[(size_t)o->reg * 32 + (size_t)lane] = v;
}

/* A register's f32, in its low 32 bits. */
static inline float as_f32(uint64_t v)
{
    return num_f32_from_bits((uint32_t)v);
}

/* Truncates to the type's width; signed types are sign-extended to 64. */
static inline uint64_t typed(uint64_t v, ptx_type t)
{
    switch (t) {
    case PT_PRED:
        return v & 1;
    case PT_B8: case PT_U8:
        return v & 0xff;
    case PT_S8:
        return (uint64_t)(int64_t)(int8_t)v;
    case PT_B16: case PT_U16: case PT_F16: case PT_BF16:
        return v & 0xffff;
    case PT_S16:
        return (uint64_t)(int64_t)(int16_t)v;
    case PT_B32: case PT_U32: case PT_F32: case PT_F16X2: case PT_BF16X2:
        return v & 0xffffffffu;
    case PT_S32:
        return (uint64_t)(int64_t)(int32_t)v;
    default:
        return v;
    }
}

/* A result stored into a register of the type's width (no sign bits). */
static inline uint64_t narrow(uint64_t v, ptx_type t)
{
    const int bytes = ptx_type_bytes(t);
    return bytes >= 8 ? v : v & ((1ull << (8 * bytes)) - 1);
}

/* ---- float helpers --------------------------------------------------- */

static inline float fin(const ptx_instr *in, float f)
{
    return in->ftz ? num_ftz(f) : f;
}

static inline float fout(const ptx_instr *in, float f)
{
    if (in->ftz)
        f = num_ftz(f);
    if (in->sat)
        f = num_sat(f);
    return f;
}

/* ---- integer arithmetic ---------------------------------------------- */

static uint64_t int_binary(const ptx_instr *in, uint64_t a, uint64_t b, uint64_t c, int *div0)
{
    const ptx_type t = (ptx_type)in->type;
    const int bytes = ptx_type_bytes(t), sgn = ptx_type_is_signed(t);
    a = typed(a, t);
    b = typed(b, t);
    switch ((ptx_opcode)in->op) {
    case OP_ADD:
        if (in->sat) { /* add.sat.s32 clamps */
            int64_t r = (int64_t)a + (int64_t)b;
            r = r > INT32_MAX ? INT32_MAX : r < INT32_MIN ? INT32_MIN : r;
            return narrow((uint64_t)r, t);
        }
        return narrow(a + b, t);
    case OP_SUB:
        if (in->sat) {
            int64_t r = (int64_t)a - (int64_t)b;
            r = r > INT32_MAX ? INT32_MAX : r < INT32_MIN ? INT32_MIN : r;
            return narrow((uint64_t)r, t);
        }
        return narrow(a - b, t);
    case OP_MUL:
    case OP_MAD: {
        uint64_t r;
        if (in->mode == MUL_WIDE) {
            r = a * b; /* both already sign/zero-extended to 64 */
            if (in->op == OP_MAD)
                r += c;
            return bytes == 4 ? r : narrow(r, bytes == 2 ? PT_U32 : PT_U64);
        }
        if (in->mode == MUL_HI) {
            if (bytes == 8) {
                __int128 p = sgn ? (__int128)(int64_t)a * (int64_t)b : (__int128)((unsigned __int128)a * b);
                r = (uint64_t)(p >> 64);
            } else {
                r = (uint64_t)((int64_t)a * (int64_t)b) >> (8 * bytes);
                if (!sgn)
                    r = (a * b) >> (8 * bytes);
            }
        } else {
            r = a * b;
        }
        if (in->op == OP_MAD)
            r += c;
        return narrow(r, t);
    }
    case OP_DIV:
    case OP_REM:
        if (narrow(b, t) == 0) {
            *div0 = 1;
            return narrow(~0ull, t);
        }
        if (sgn) {
            int64_t x = (int64_t)a, y = (int64_t)b;
            if (y == -1) /* INT_MIN / -1 wraps, as the hardware's does */
                return narrow(in->op == OP_DIV ? (uint64_t)0 - (uint64_t)x : 0, t);
            return narrow((uint64_t)(in->op == OP_DIV ? x / y : x % y), t);
        }
        return narrow(in->op == OP_DIV ? a / b : a % b, t);
    case OP_MIN:
        return narrow(sgn ? ((int64_t)a < (int64_t)b ? a : b) : (a < b ? a : b), t);
    case OP_MAX:
        return narrow(sgn ? ((int64_t)a > (int64_t)b ? a : b) : (a > b ? a : b), t);
    case OP_AND:
        return narrow(a & b, t);
    case OP_OR:
        return narrow(a | b, t);
    case OP_XOR:
        return narrow(a ^ b, t);
    case OP_SHL: {
        const uint64_t n = b & 0xffffffffu;
        return n >= (uint64_t)(8 * bytes) ? 0 : narrow(a << n, t);
    }
    case OP_SHR: {
        const uint64_t n = b & 0xffffffffu;
        if (sgn)
            return narrow((uint64_t)((int64_t)a >> (n >= (uint64_t)(8 * bytes) ? 63 : n)), t);
        return n >= (uint64_t)(8 * bytes) ? 0 : narrow(a >> n, t);
    }
    default:
        return 0;
    }
}

static int setp_compare(const ptx_instr *in, uint64_t a, uint64_t b)
{
    const ptx_type t = (ptx_type)in->type;
    if (t == PT_F32 || t == PT_F64) {
        const double x = t == PT_F32 ? (double)fin(in, as_f32(a)) : num_f64_from_bits(a);
        const double y = t == PT_F32 ? (double)fin(in, as_f32(b)) : num_f64_from_bits(b);
        const int un = isnan(x) || isnan(y);
        switch (in->cmp) {
        case CMP_EQ: return !un && x == y;
        case CMP_NE: return !un && x != y;
        case CMP_LT: return !un && x < y;
        case CMP_LE: return !un && x <= y;
        case CMP_GT: return !un && x > y;
        case CMP_GE: return !un && x >= y;
        case CMP_EQU: return un || x == y;
        case CMP_NEU: return un || x != y;
        case CMP_LTU: return un || x < y;
        case CMP_LEU: return un || x <= y;
        case CMP_GTU: return un || x > y;
        case CMP_GEU: return un || x >= y;
        case CMP_NUM: return !un;
        case CMP_NAN: return un;
        default: return 0;
        }
    }
    a = typed(a, t);
    b = typed(b, t);
    const int sgn = ptx_type_is_signed(t);
    const int lt = sgn ? (int64_t)a < (int64_t)b : a < b;
    const int gt = sgn ? (int64_t)a > (int64_t)b : a > b;
    switch (in->cmp) {
    case CMP_EQ: return a == b;
    case CMP_NE: return a != b;
    case CMP_LT: return lt;
    case CMP_LE: return !gt;
    case CMP_GT: return gt;
    case CMP_GE: return !lt;
    case CMP_LO: return a < b;
    case CMP_LS: return a <= b;
    case CMP_HI: return a > b;
    case CMP_HS: return a >= b;
    default: return 0;
    }
}

/* ---- conversions ------------------------------------------------------ */

static uint64_t convert(const ptx_instr *in, uint64_t v)
{
    const ptx_type d = (ptx_type)in->type, s = (ptx_type)in->stype;
    const int dflt = ptx_type_is_float(d), sflt = ptx_type_is_float(s);
    if (!dflt && !sflt) /* integer to integer: truncate or extend */
        return narrow(typed(v, s), d);
    double x = 0;
    if (sflt) {
        if (s == PT_F16)
            x = num_f16_to_f32((uint16_t)v);
        else if (s == PT_BF16)
            x = num_bf16_to_f32((uint16_t)v);
        else if (s == PT_F32)
            x = (in->ftz ? num_ftz(as_f32(v)) : as_f32(v));
        else
            x = num_f64_from_bits(v);
    }
    if (!dflt) /* float to integer */
        return num_float_to_int(x, in->rnd, d);
    if (!sflt) { /* integer to float */
        const uint64_t iv = typed(v, s);
        if (d == PT_F64)
            return num_f64_bits(num_int_to_f64(iv, ptx_type_is_signed(s), in->rnd));
        float f = num_int_to_f32(iv, ptx_type_is_signed(s), in->rnd);
        if (d == PT_F32)
            return num_f32_bits(fout(in, f));
        return d == PT_F16 ? num_f32_to_f16(f) : num_f32_to_bf16(f);
    }
    /* float to float */
    if (in->rnd >= RND_RNI)
        x = num_round_integral(x, in->rnd);
    switch (d) {
    case PT_F64:
        return num_f64_bits(x);
    case PT_F32: {
        float f = s == PT_F64 ? num_f64_to_f32(x, in->rnd) : (float)x;
        return num_f32_bits(fout(in, f));
    }
    case PT_F16:
        return num_f32_to_f16(in->sat ? num_sat((float)x) : (float)x);
    default:
        return num_f32_to_bf16(in->sat ? num_sat((float)x) : (float)x);
    }
}

/* ---- memory ----------------------------------------------------------- */

/* Faults on an access to shared byte a that races with thread wr's write
 * since the last barrier; access and wrote complete the message. */
static int writer_race(block_ctx *b, warp *w, int lane, const ptx_instr *in, uint64_t a, int32_t wr,
                       const char *access, const char *wrote)
{
    unsigned o[3];
    thread_coords(b, wr, o);
    return fault(b, CU_LAUNCH_FAILED, w, lane, in,
                 "shared-memory race: %s offset 0x%llx, which thread (%u,%u,%u) %s since the last barrier", access,
                 (unsigned long long)a, o[0], o[1], o[2], wrote);
}

static int shared_access(block_ctx *b, warp *w, int lane, const ptx_instr *in, uint64_t addr, int bytes,
                         int is_store)
{
    if (addr >= (uint64_t)b->shared_bytes || (uint64_t)bytes > (uint64_t)b->shared_bytes - addr)
        return fault(b, CU_ILLEGAL_ADDRESS, w, lane, in,
                     "shared memory access at offset 0x%llx (%d bytes) is outside the block's %lld bytes",
                     (unsigned long long)addr, bytes, (long long)b->shared_bytes);
    if (!b->l->checks)
        return 0;
    const int tid = w->index * 32 + lane;
    for (int i = 0; i < bytes; i++) {
        const uint64_t a = addr + (uint64_t)i;
        if (b->sh_epoch[a] != b->epoch) {
            b->sh_epoch[a] = b->epoch;
            b->sh_writer[a] = -1;
            b->sh_reader[a] = -1;
        }
        const int32_t wr = b->sh_writer[a], rd = b->sh_reader[a];
        if (is_store) {
            if (wr >= 0 && wr != tid)
                return writer_race(b, w, lane, in, a, wr, "write to", "also wrote");
            if (rd == -2 || (rd >= 0 && rd != tid))
                return fault(b, CU_LAUNCH_FAILED, w, lane, in,
                             "shared-memory race: write to offset 0x%llx, which %s read since the last barrier",
                             (unsigned long long)a, rd == -2 ? "several other threads" : "another thread");
            b->sh_writer[a] = tid;
            b->sh_init[a] = 1;
        } else {
            if (!b->sh_init[a])
                return fault(b, CU_LAUNCH_FAILED, w, lane, in,
                             "read of shared memory at offset 0x%llx, which no thread has written",
                             (unsigned long long)a);
            if (wr >= 0 && wr != tid)
                return writer_race(b, w, lane, in, a, wr, "read of", "wrote");
            b->sh_reader[a] = rd == -1 || rd == tid ? tid : -2;
        }
    }
    return 0;
}

/* ld and st for the active lanes. */
static int exec_memory(block_ctx *b, warp *w, const ptx_instr *in, uint32_t em)
{
    const ptx_type t = (ptx_type)in->type;
    const int es = ptx_type_bytes(t), nv = in->vec, bytes = es * nv;
    const int is_store = in->op == OP_ST;
    const ptx_operand *mo = is_store ? &in->o[0] : &in->o[1];
    const ptx_operand *vo = is_store ? &in->o[1] : &in->o[0];
    uint64_t addr[32];
    for (uint32_t m = em; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        addr[l] = (mo->reg >= 0 ? w->regs[(size_t)mo->reg * 32 + (size_t)l] : 0) + (uint64_t)mo->imm;
        if (in->space != SP_PARAM && addr[l] % (uint64_t)bytes)
            return fault(b, CU_MISALIGNED_ADDRESS, w, l, in, "address 0x%llx of a %d-byte access is misaligned",
                         (unsigned long long)addr[l], bytes);
    }
    if (in->space == SP_GLOBAL) {
        const sim_region *last = NULL;
        for (uint32_t m = em; m; m &= m - 1) {
            const int l = __builtin_ctz(m);
            if (!last || addr[l] < last->base || addr[l] - last->base + (uint64_t)bytes > last->size) {
                last = sim_memory_find(b->l->mem, addr[l], (uint64_t)bytes);
                if (!last)
                    return fault(b, CU_ILLEGAL_ADDRESS, w, l, in,
                                 "global address 0x%llx (%d bytes) is outside every allocation",
                                 (unsigned long long)addr[l], bytes);
            }
        }
        /* ld.global.nc goes through the read-only path, which is not
         * coherent with the kernel's own stores: reading bytes this launch
         * wrote may return the old data on a GPU. */
        if (in->nc && b->l->checks)
            for (uint32_t m = em; m; m &= m - 1) {
                const int l = __builtin_ctz(m);
                if (sectors_any_written(b->sectors, addr[l], bytes))
                    return fault(b, CU_LAUNCH_FAILED, w, l, in,
                                 "ld.global.nc of 0x%llx (%d bytes) reads memory this launch wrote: the "
                                 "non-coherent read-only path may return stale data",
                                 (unsigned long long)addr[l], bytes);
            }
        count_request(b, addr, em, bytes, is_store);
        if (is_store)
            for (uint32_t m = em; m; m &= m - 1) {
                const int l = __builtin_ctz(m);
                sectors_mark_written(b->sectors, addr[l], bytes);
            }
    }
    for (uint32_t m = em; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        uint8_t *p;
        if (in->space == SP_GLOBAL) {
            p = (uint8_t *)(uintptr_t)addr[l];
        } else if (in->space == SP_SHARED) {
            if (shared_access(b, w, l, in, addr[l], bytes, is_store))
                return b->res->code;
            p = b->shared + addr[l];
        } else {
            if (addr[l] >= (uint64_t)b->f->param_bytes || (uint64_t)bytes > (uint64_t)b->f->param_bytes - addr[l])
                return fault(b, CU_ILLEGAL_ADDRESS, w, l, in, "parameter offset %llu (%d bytes) is outside the %lld-byte parameters",
                             (unsigned long long)addr[l], bytes, (long long)b->f->param_bytes);
            p = (uint8_t *)b->l->params + addr[l];
        }
        for (int k = 0; k < nv; k++) {
            const int slot = vo->kind == OPD_VEC ? vo->vec[k] : vo->reg;
            if (is_store) {
                uint64_t v = vo->kind == OPD_IMM ? (uint64_t)vo->imm : slot >= 0 ? w->regs[(size_t)slot * 32 + (size_t)l] : 0;
                memcpy(p + k * es, &v, (size_t)es);
            } else if (slot >= 0) {
                uint64_t v = 0;
                memcpy(&v, p + k * es, (size_t)es);
                /* A signed load sign-extends into a wider register; every
                 * reader masks a register to its instruction's type. */
                w->regs[(size_t)slot * 32 + (size_t)l] = ptx_type_is_signed(t) ? typed(v, t) : narrow(v, t);
            }
        }
    }
    return 0;
}

/* ---- shuffles --------------------------------------------------------- */

static int exec_shfl(block_ctx *b, warp *w, const ptx_instr *in, uint32_t em)
{
    uint64_t val[32];
    uint32_t members[32];
    for (uint32_t m = em; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        val[l] = src(b, w, &in->o[1], l) & 0xffffffffu;
        members[l] = (uint32_t)src(b, w, &in->o[4], l);
        if (!(members[l] >> l & 1))
            return fault(b, CU_LAUNCH_FAILED, w, l, in, "lane %d executes shfl.sync outside its membermask 0x%08x", l,
                         members[l]);
        const uint32_t absent = members[l] & ~em & w->live;
        if (absent)
            return fault(b, CU_LAUNCH_FAILED, w, l, in,
                         "shfl.sync membermask 0x%08x names lanes 0x%08x that are not executing it (inactive "
                         "on another path)",
                         members[l], absent);
    }
    uint64_t out[32];
    int pout[32];
    for (uint32_t m = em; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        const uint32_t bv = (uint32_t)src(b, w, &in->o[2], l) & 31, c = (uint32_t)src(b, w, &in->o[3], l);
        const uint32_t cval = c & 31, segmask = (c >> 8) & 31;
        const uint32_t max_lane = ((uint32_t)l & segmask) | (cval & ~segmask), min_lane = (uint32_t)l & segmask;
        int j;
        int pval;
        switch (in->mode) {
        case SHFL_UP:
            j = l - (int)bv;
            pval = j >= (int)max_lane;
            break;
        case SHFL_DOWN:
            j = l + (int)bv;
            pval = j <= (int)max_lane;
            break;
        case SHFL_BFLY:
            j = l ^ (int)bv;
            pval = j <= (int)max_lane;
            break;
        default:
            j = (int)(min_lane | (bv & ~segmask));
            pval = j <= (int)max_lane;
            break;
        }
        if (!pval)
            j = l;
        if (!(em >> j & 1) || !(members[l] >> j & 1))
            return fault(b, CU_LAUNCH_FAILED, w, l, in,
                         "shfl.sync reads lane %d, which is %s (membermask 0x%08x)", j,
                         !(members[l] >> j & 1) ? "outside the membermask" : "not executing it", members[l]);
        out[l] = val[j];
        pout[l] = pval;
    }
    for (uint32_t m = em; m; m &= m - 1) {
        const int l = __builtin_ctz(m);
        dst(w, &in->o[0], l, out[l]);
        if (in->o[0].nvec && in->o[0].vec[0] >= 0)
            w->regs[(size_t)in->o[0].vec[0] * 32 + (size_t)l] = (uint64_t)pout[l];
    }
    return 0;
}

/* ---- one instruction for the active lanes ---------------------------- */

#define LANES(em) for (uint32_t m_ = (em), l; m_ && (l = (uint32_t)__builtin_ctz(m_), 1); m_ &= m_ - 1)

static int exec_alu(block_ctx *b, warp *w, const ptx_instr *in, uint32_t em)
{
    const ptx_type t = (ptx_type)in->type;
    const ptx_operand *o = in->o;
    switch ((ptx_opcode)in->op) {
    case OP_MOV:
        if (o[1].kind == OPD_VEC) { /* pack: the first element is the low part */
            const int part = 8 * ptx_type_bytes(t) / o[1].nvec;
            LANES(em)
            {
                uint64_t v = 0;
                for (int k = 0; k < o[1].nvec; k++) {
                    uint64_t x = w->regs[(size_t)o[1].vec[k] * 32 + l];
                    v |= (part == 64 ? x : x & ((1ull << part) - 1)) << (k * part);
                }
                dst(w, &o[0], (int)l, v);
            }
        } else {
            LANES(em) dst(w, &o[0], (int)l, narrow(src(b, w, &o[1], (int)l), t));
        }
        return 0;
    case OP_CVTA:
        LANES(em) dst(w, &o[0], (int)l, src(b, w, &o[1], (int)l));
        return 0;
    case OP_NOT:
        LANES(em) dst(w, &o[0], (int)l, t == PT_PRED ? !src(b, w, &o[1], (int)l) : narrow(~src(b, w, &o[1], (int)l), t));
        return 0;
    case OP_CVT:
        if (t == PT_F16X2 || t == PT_BF16X2) { /* a goes to the upper half, b to the lower */
            LANES(em)
            {
                const float hi = as_f32(src(b, w, &o[1], (int)l)), lo = as_f32(src(b, w, &o[2], (int)l));
                const uint64_t h = t == PT_F16X2 ? num_f32_to_f16(hi) : num_f32_to_bf16(hi);
                const uint64_t g = t == PT_F16X2 ? num_f32_to_f16(lo) : num_f32_to_bf16(lo);
                dst(w, &o[0], (int)l, h << 16 | g);
            }
            return 0;
        }
        LANES(em) dst(w, &o[0], (int)l, convert(in, src(b, w, &o[1], (int)l)));
        return 0;
    case OP_SELP:
        LANES(em)
        {
            const int c = (int)(src(b, w, &o[3], (int)l) & 1) ^ o[3].neg;
            dst(w, &o[0], (int)l, narrow(src(b, w, &o[c ? 1 : 2], (int)l), t));
        }
        return 0;
    case OP_SETP:
        LANES(em)
        {
            int r = setp_compare(in, src(b, w, &o[1], (int)l), src(b, w, &o[2], (int)l));
            int q = !r;
            if (in->boolop) {
                const int c = (int)(src(b, w, &o[3], (int)l) & 1) ^ o[3].neg;
                r = in->boolop == 1 ? r && c : in->boolop == 2 ? r || c : r ^ c;
                q = in->boolop == 1 ? q && c : in->boolop == 2 ? q || c : q ^ c;
            }
            dst(w, &o[0], (int)l, (uint64_t)r);
            if (o[0].nvec && o[0].vec[0] >= 0)
                w->regs[(size_t)o[0].vec[0] * 32 + l] = (uint64_t)q;
        }
        return 0;
    case OP_BFI:
        LANES(em)
        {
            const int bits = 8 * ptx_type_bytes(t);
            const uint64_t a = src(b, w, &o[1], (int)l), base = narrow(src(b, w, &o[2], (int)l), t);
            const uint32_t pos = (uint32_t)src(b, w, &o[3], (int)l) & 0xff, len = (uint32_t)src(b, w, &o[4], (int)l) & 0xff;
            uint64_t r = base;
            if (len && pos < (uint32_t)bits) {
                const uint32_t n = len > (uint32_t)bits - pos ? (uint32_t)bits - pos : len;
                const uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << pos;
                r = (base & ~mask) | ((a << pos) & mask);
            }
            dst(w, &o[0], (int)l, narrow(r, t));
        }
        return 0;
    case OP_BFE:
        LANES(em)
        {
            const int bits = 8 * ptx_type_bytes(t), sgn = ptx_type_is_signed(t);
            const uint64_t a = narrow(src(b, w, &o[1], (int)l), t);
            const uint32_t pos = (uint32_t)src(b, w, &o[2], (int)l) & 0xff, len = (uint32_t)src(b, w, &o[3], (int)l) & 0xff;
            uint64_t r = 0;
            for (int i = 0; i < bits; i++) {
                uint64_t bit;
                if ((uint32_t)i < len && pos + (uint32_t)i < (uint32_t)bits)
                    bit = a >> (pos + (uint32_t)i) & 1;
                else if (sgn && len)
                    bit = a >> (pos + len - 1 < (uint32_t)bits ? pos + len - 1 : (uint32_t)bits - 1) & 1;
                else
                    bit = 0;
                if (!sgn && (uint32_t)i >= len)
                    bit = 0;
                r |= bit << i;
            }
            dst(w, &o[0], (int)l, narrow(r, t));
        }
        return 0;
    default:
        break;
    }
    if (t == PT_F32) {
        switch ((ptx_opcode)in->op) {
        case OP_ADD:
        case OP_SUB:
        case OP_MUL: {
            const char op = in->op == OP_ADD ? '+' : in->op == OP_SUB ? '-' : '*';
            LANES(em)
            {
                float r = num_f32_binary(op, fin(in, as_f32(src(b, w, &o[1], (int)l))),
                                         fin(in, as_f32(src(b, w, &o[2], (int)l))), in->rnd);
                dst(w, &o[0], (int)l, num_f32_bits(fout(in, r)));
            }
            return 0;
        }
        case OP_FMA:
        case OP_MAD:
            LANES(em)
            {
                float r = num_f32_fma(fin(in, as_f32(src(b, w, &o[1], (int)l))), fin(in, as_f32(src(b, w, &o[2], (int)l))),
                                      fin(in, as_f32(src(b, w, &o[3], (int)l))), in->rnd);
                dst(w, &o[0], (int)l, num_f32_bits(fout(in, r)));
            }
            return 0;
        case OP_DIV:
            LANES(em)
            {
                const float x = fin(in, as_f32(src(b, w, &o[1], (int)l))), y = fin(in, as_f32(src(b, w, &o[2], (int)l)));
                /* div.approx computes x * (1 / y), within 2 ulp for |y| in [2^-126, 2^126]. */
                float r;
                if (in->approx != 1)
                    r = num_f32_binary('/', x, y, in->rnd);
                else if (fabsf(y) > 0x1p126f && fabsf(y) < INFINITY) /* documented: 0, or NaN for an infinite x */
                    r = isinf(x) ? NAN : copysignf(0.0f, signbit(x) != signbit(y) ? -1.0f : 1.0f);
                else
                    r = x * fin(in, 1.0f / y);
                dst(w, &o[0], (int)l, num_f32_bits(fout(in, r)));
            }
            return 0;
        case OP_NEG:
            LANES(em) dst(w, &o[0], (int)l, num_f32_bits(fout(in, -fin(in, as_f32(src(b, w, &o[1], (int)l))))));
            return 0;
        case OP_ABS:
            LANES(em) dst(w, &o[0], (int)l, num_f32_bits(fout(in, fabsf(fin(in, as_f32(src(b, w, &o[1], (int)l)))))));
            return 0;
        case OP_MIN:
        case OP_MAX:
            LANES(em)
            {
                const float x = fin(in, as_f32(src(b, w, &o[1], (int)l))), y = fin(in, as_f32(src(b, w, &o[2], (int)l)));
                dst(w, &o[0], (int)l, num_f32_bits(fout(in, in->op == OP_MIN ? num_f32_min(x, y) : num_f32_max(x, y))));
            }
            return 0;
        case OP_EX2:
            LANES(em) dst(w, &o[0], (int)l, num_f32_bits(fout(in, exp2f(fin(in, as_f32(src(b, w, &o[1], (int)l)))))));
            return 0;
        case OP_LG2:
            LANES(em) dst(w, &o[0], (int)l, num_f32_bits(fout(in, log2f(fin(in, as_f32(src(b, w, &o[1], (int)l)))))));
            return 0;
        case OP_RSQRT:
            LANES(em)
            {
                const float x = fin(in, as_f32(src(b, w, &o[1], (int)l)));
                dst(w, &o[0], (int)l, num_f32_bits(fout(in, (float)(1.0 / sqrt((double)x)))));
            }
            return 0;
        case OP_SQRT:
            LANES(em) dst(w, &o[0], (int)l, num_f32_bits(fout(in, num_f32_sqrt(fin(in, as_f32(src(b, w, &o[1], (int)l))), in->rnd))));
            return 0;
        case OP_RCP:
            LANES(em)
            {
                const float x = fin(in, as_f32(src(b, w, &o[1], (int)l)));
                dst(w, &o[0], (int)l, num_f32_bits(fout(in, num_f32_binary('/', 1.0f, x, in->approx ? RND_RN : in->rnd))));
            }
            return 0;
        default:
            break;
        }
    } else if (t == PT_F64) {
        switch ((ptx_opcode)in->op) {
        case OP_ADD:
        case OP_SUB:
        case OP_MUL:
        case OP_DIV: {
            const char op = in->op == OP_ADD ? '+' : in->op == OP_SUB ? '-' : in->op == OP_MUL ? '*' : '/';
            LANES(em)
            dst(w, &o[0], (int)l, num_f64_bits(num_f64_binary(op, num_f64_from_bits(src(b, w, &o[1], (int)l)), num_f64_from_bits(src(b, w, &o[2], (int)l)), in->rnd)));
            return 0;
        }
        case OP_FMA:
        case OP_MAD:
            LANES(em)
            dst(w, &o[0], (int)l, num_f64_bits(num_f64_fma(num_f64_from_bits(src(b, w, &o[1], (int)l)), num_f64_from_bits(src(b, w, &o[2], (int)l)), num_f64_from_bits(src(b, w, &o[3], (int)l)), in->rnd)));
            return 0;
        case OP_NEG:
            LANES(em) dst(w, &o[0], (int)l, src(b, w, &o[1], (int)l) ^ 0x8000000000000000ull);
            return 0;
        case OP_ABS:
            LANES(em) dst(w, &o[0], (int)l, src(b, w, &o[1], (int)l) & 0x7fffffffffffffffull);
            return 0;
        case OP_MIN:
        case OP_MAX:
            LANES(em)
            {
                const double x = num_f64_from_bits(src(b, w, &o[1], (int)l)), y = num_f64_from_bits(src(b, w, &o[2], (int)l));
                dst(w, &o[0], (int)l, num_f64_bits(in->op == OP_MIN ? num_f64_min(x, y) : num_f64_max(x, y)));
            }
            return 0;
        case OP_SQRT:
            LANES(em) dst(w, &o[0], (int)l, num_f64_bits(num_f64_sqrt(num_f64_from_bits(src(b, w, &o[1], (int)l)), in->rnd)));
            return 0;
        case OP_RCP:
            LANES(em) dst(w, &o[0], (int)l, num_f64_bits(num_f64_binary('/', 1.0, num_f64_from_bits(src(b, w, &o[1], (int)l)), in->rnd)));
            return 0;
        default:
            break;
        }
    } else if (t == PT_PRED) {
        LANES(em)
        {
            const uint64_t x = src(b, w, &o[1], (int)l) & 1, y = src(b, w, &o[2], (int)l) & 1;
            dst(w, &o[0], (int)l, in->op == OP_AND ? x & y : in->op == OP_OR ? x | y : x ^ y);
        }
        return 0;
    } else {
        if (in->op == OP_NEG || in->op == OP_ABS) {
            LANES(em)
            {
                const int64_t x = (int64_t)typed(src(b, w, &o[1], (int)l), t);
                dst(w, &o[0], (int)l, narrow(in->op == OP_NEG ? (uint64_t)0 - (uint64_t)x : (uint64_t)(x < 0 ? -(uint64_t)x : (uint64_t)x), t));
            }
            return 0;
        }
        int div0 = 0;
        LANES(em)
        {
            const uint64_t a = src(b, w, &o[1], (int)l), bb = src(b, w, &o[2], (int)l);
            const uint64_t c = in->op == OP_MAD ? src(b, w, &o[3], (int)l) : 0;
            dst(w, &o[0], (int)l, int_binary(in, a, bb, c, &div0));
        }
        return 0;
    }
    return fault(b, CU_ILLEGAL_INSTRUCTION, w, -1, in, "the simulator cannot execute this instruction");
}

/* ---- warps and blocks -------------------------------------------------- */

static int push(block_ctx *b, warp *w, const ptx_instr *in, int pc, int rpc, uint32_t mask)
{
    if (w->nstack == SIM_STACK_MAX)
        return fault(b, CU_LAUNCH_FAILED, w, -1, in, "divergence nests deeper than %d levels", SIM_STACK_MAX);
    w->stack[w->nstack++] = (simt_entry){pc, rpc, mask};
    return 0;
}

/* The instruction lanes parked at pc run next, after unconditional
 * branches: an exit, or -1 when they have other work. */
static int leads_to_exit(const ptx_function *f, int pc)
{
    for (int hops = 0; hops < 8 && pc >= 0 && pc < f->ncode; hops++) {
        const ptx_instr *in = &f->code[pc];
        if (in->guard >= 0)
            return 0;
        if (in->op == OP_RET || in->op == OP_EXIT)
            return 1;
        if (in->op != OP_BRA)
            return 0;
        pc = (int)in->o[0].imm;
    }
    return 0;
}

/* At a barrier that not all of the warp's lanes reach: lanes parked lower
 * on the stack whose next instruction is an exit (`if (tid >= n) return;`
 * before __syncthreads, where the return is also where the branch
 * reconverges) can only exit, so they exit now, as they would on a GPU
 * that runs them first. Lanes with other work stay, and the barrier then
 * reports divergence. */
static void retire_exiting_lanes(block_ctx *b, warp *w, uint32_t at_barrier)
{
    uint32_t missing = w->live & ~at_barrier, exiting = 0;
    for (int i = w->nstack - 2; i >= 0 && missing; i--) {
        const uint32_t lanes = w->stack[i].mask & missing;
        if (!lanes)
            continue;
        if (!leads_to_exit(b->f, w->stack[i].pc))
            return;
        exiting |= lanes;
        missing &= ~lanes;
    }
    if (!missing)
        w->live &= ~exiting;
}

/* Runs a warp until it waits at a barrier, exits or faults. */
static int run_warp(block_ctx *b, warp *w)
{
    const ptx_function *f = b->f;
    while (w->state == WARP_RUNNING) {
        if (w->nstack == 0 || !w->live) {
            w->state = WARP_DONE;
            return 0;
        }
        simt_entry *e = &w->stack[w->nstack - 1];
        const uint32_t m = e->mask & w->live;
        if (!m || e->pc == e->rpc) {
            w->nstack--;
            continue;
        }
        if (e->pc < 0 || e->pc >= f->ncode)
            return fault(b, CU_ILLEGAL_INSTRUCTION, w, -1, NULL, "lanes 0x%08x ran past the end of the kernel", m);
        const ptx_instr *in = &f->code[e->pc];
        if (++b->issued > SIM_BLOCK_BUDGET)
            return fault(b, CU_LAUNCH_TIMEOUT, w, -1, in,
                         "the block issued more than %lld warp instructions: presumed hung", (long long)SIM_BLOCK_BUDGET);
        b->res->traffic.warp_instructions++;
        uint32_t em = m;
        if (in->guard >= 0) {
            em = 0;
            const uint64_t *p = w->regs + (size_t)in->guard * 32;
            LANES(m) em |= (uint32_t)(((p[l] & 1) ^ in->guard_neg) & 1) << l;
        }
        switch ((ptx_opcode)in->op) {
        case OP_BRA: {
            const int target = (int)in->o[0].imm;
            const uint32_t nt = m & ~em;
            if (!nt) {
                e->pc = target;
            } else if (!em) {
                e->pc++;
            } else {
                const int rpc = in->reconv, fall = e->pc + 1;
                if (rpc == e->rpc) { /* this entry ends where the sides meet: reuse it */
                    e->pc = fall;
                    e->mask = nt;
                } else {
                    e->pc = rpc;
                    if (push(b, w, in, fall, rpc, nt))
                        return b->res->code;
                }
                if (push(b, w, in, target, rpc, em))
                    return b->res->code;
            }
            break;
        }
        case OP_RET:
        case OP_EXIT:
            w->live &= ~em;
            if (em != m)
                e->pc++;
            break;
        case OP_BAR: {
            if (em != w->live)
                retire_exiting_lanes(b, w, em);
            if (em != w->live) {
                const uint32_t skip = w->live & ~em;
                return fault(b, CU_LAUNCH_FAILED, w, em ? __builtin_ctz(em) : -1, in,
                             "barrier divergence: lanes 0x%08x of warp %d reach bar.sync while lanes 0x%08x of "
                             "the same warp, not exited, do not",
                             em, w->index, skip);
            }
            const int id = (int)src(b, w, &in->o[0], __builtin_ctz(em));
            const int count = in->nops > 1 ? (int)src(b, w, &in->o[1], __builtin_ctz(em)) : 0;
            if (id < 0 || id > 15)
                return fault(b, CU_ILLEGAL_INSTRUCTION, w, -1, in, "barrier %d does not exist (0 to 15)", id);
            if (in->nops > 1 && (count < 1 || count % 32))
                return fault(b, CU_ILLEGAL_INSTRUCTION, w, -1, in,
                             "bar.sync thread count %d is not a positive multiple of 32", count);
            w->bar_id = id;
            w->bar_count = count;
            w->bar_pc = e->pc;
            w->state = WARP_AT_BARRIER;
            e->pc++;
            return 0;
        }
        case OP_LD:
        case OP_ST:
            if (em && exec_memory(b, w, in, em))
                return b->res->code;
            e->pc++;
            break;
        case OP_SHFL:
            if (em && exec_shfl(b, w, in, em))
                return b->res->code;
            e->pc++;
            break;
        default:
            if (em && exec_alu(b, w, in, em))
                return b->res->code;
            e->pc++;
            break;
        }
    }
    return 0;
}

/* Releases the barriers that can complete; a fault when none can and no
 * warp can run. Returns 1 when some warp was released. */
static int release_barriers(block_ctx *b)
{
    int live_threads = 0, waiting = 0;
    int at_id[16] = {0}, threads_at[16] = {0}, want[16] = {0};
    for (int i = 0; i < b->nwarps; i++) {
        const warp *w = &b->warps[i];
        if (w->state == WARP_DONE)
            continue;
        live_threads += 32;
        if (w->state == WARP_AT_BARRIER) {
            waiting++;
            at_id[w->bar_id]++;
            threads_at[w->bar_id] += 32;
            if (w->bar_count)
                want[w->bar_id] = w->bar_count;
        }
    }
    int released = 0;
    for (int id = 0; id < 16; id++) {
        if (!at_id[id])
            continue;
        const int need = want[id] ? want[id] : live_threads;
        if (threads_at[id] < need)
            continue;
        for (int i = 0; i < b->nwarps; i++) {
            warp *w = &b->warps[i];
            if (w->state == WARP_AT_BARRIER && w->bar_id == id) {
                w->state = WARP_RUNNING;
                released = 1;
            }
        }
        b->epoch++;
    }
    if (released || !waiting)
        return released;
    /* Every warp still running waits, and no barrier can complete. */
    char desc[512] = "";
    size_t n = 0;
    for (int i = 0; i < b->nwarps && n + 64 < sizeof desc; i++) {
        const warp *w = &b->warps[i];
        if (w->state != WARP_AT_BARRIER)
            continue;
        char count[32] = "";
        if (w->bar_count)
            snprintf(count, sizeof count, ", count %d", w->bar_count);
        n += (size_t)snprintf(desc + n, sizeof desc - n, "%swarp %d at barrier %d (line %d%s)", n ? ", " : "",
                              w->index, w->bar_id, b->f->code[w->bar_pc].line, count);
    }
    const warp *first = NULL;
    for (int i = 0; i < b->nwarps && !first; i++)
        if (b->warps[i].state == WARP_AT_BARRIER)
            first = &b->warps[i];
    fault(b, CU_LAUNCH_TIMEOUT, first, first ? __builtin_ctz(first->live) : -1,
          first ? &b->f->code[first->bar_pc] : NULL,
          "a barrier that can never complete: %d threads have not exited and %s", live_threads, desc);
    return -1;
}

static int run_block(block_ctx *b)
{
    const int64_t nregs = b->f->nregs > 0 ? b->f->nregs : 1;
    for (int i = 0; i < b->nwarps; i++) {
        warp *w = &b->warps[i];
        w->index = i;
        const int lanes = b->nthreads - 32 * i >= 32 ? 32 : b->nthreads - 32 * i;
        w->live = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        w->state = WARP_RUNNING;
        w->nstack = 1;
        w->stack[0] = (simt_entry){0, -1, w->live};
        memset(w->regs, 0, (size_t)nregs * 32 * sizeof *w->regs);
    }
    if (b->l->checks && b->shared_bytes) {
        memset(b->sh_epoch, 0xff, (size_t)b->shared_bytes * sizeof *b->sh_epoch);
        memset(b->sh_init, 0, (size_t)b->shared_bytes);
    }
    b->epoch = 0;
    b->issued = 0;
    for (;;) {
        int running = 0;
        for (int i = 0; i < b->nwarps; i++) {
            warp *w = &b->warps[i];
            if (w->state != WARP_RUNNING)
                continue;
            running = 1;
            if (run_warp(b, w))
                return b->res->code;
        }
        int done = 1;
        for (int i = 0; i < b->nwarps; i++)
            done &= b->warps[i].state == WARP_DONE;
        if (done)
            return 0;
        int r = release_barriers(b);
        if (r < 0)
            return b->res->code;
        if (!r && !running)
            return fault(b, CU_LAUNCH_FAILED, NULL, -1, NULL, "the block can make no progress");
    }
}

double sim_model_us(const cudasim_traffic *t)
{
    const double bytes = (double)t->distinct_sectors * 32.0;
    const double mem_us = bytes / (SIM_DRAM_GBPS * 1e3);
    const double issue_us = (double)t->warp_instructions / ((double)SIM_SMS * 4.0 * SIM_CLOCK_KHZ * 1e-3);
    return (mem_us > issue_us ? mem_us : issue_us) + SIM_LAUNCH_US;
}

int sim_run(const sim_launch *l, sim_result *r)
{
    memset(r, 0, sizeof *r);
    const ptx_function *f = l->f;
    block_ctx b = {.l = l, .f = f, .res = r};
    sector_set sectors = {0};
    b.sectors = &sectors;
    b.nthreads = (int)(l->block[0] * l->block[1] * l->block[2]);
    b.nwarps = (b.nthreads + 31) / 32;
    b.shared_bytes = f->static_shared;
    if (l->dynamic_shared)
        b.shared_bytes = ((f->static_shared + f->dynamic_align - 1) / f->dynamic_align) * f->dynamic_align +
                         l->dynamic_shared;
    const int64_t nregs = f->nregs > 0 ? f->nregs : 1;
    b.warps = calloc((size_t)b.nwarps, sizeof *b.warps);
    int ok = b.warps != NULL;
    for (int i = 0; ok && i < b.nwarps; i++)
        ok = (b.warps[i].regs = malloc((size_t)nregs * 32 * sizeof(uint64_t))) != NULL;
    const size_t sh = (size_t)(b.shared_bytes ? b.shared_bytes : 1);
    ok = ok && (b.shared = malloc(sh)) != NULL;
    if (ok && l->checks)
        ok = (b.sh_epoch = malloc(sh * sizeof *b.sh_epoch)) && (b.sh_writer = malloc(sh * sizeof *b.sh_writer)) &&
             (b.sh_reader = malloc(sh * sizeof *b.sh_reader)) && (b.sh_init = malloc(sh));
    if (!ok) {
        r->code = CU_LAUNCH_FAILED;
        snprintf(r->message, sizeof r->message, "kernel %s: the simulator ran out of memory", f->name);
    }
    for (unsigned z = 0; ok && !r->code && z < l->grid[2]; z++)
        for (unsigned y = 0; !r->code && y < l->grid[1]; y++)
            for (unsigned x = 0; !r->code && x < l->grid[0]; x++) {
                b.cta[0] = x, b.cta[1] = y, b.cta[2] = z;
                /* Shared memory starts as garbage on a GPU: a pattern that
                 * reads as NaN makes a missed initialisation visible. */
                memset(b.shared, 0xff, sh);
                run_block(&b);
            }
    for (size_t i = 0; i < sectors.cap; i++) {
        if (!sectors.keys[i])
            continue;
        r->traffic.distinct_sectors++;
        if (sectors.flags[i] & 1)
            r->traffic.read_bytes += 32;
        if (sectors.flags[i] & 2)
            r->traffic.write_bytes += 32;
    }
    r->traffic.model_us = sim_model_us(&r->traffic);
    for (int i = 0; b.warps && i < b.nwarps; i++)
        free(b.warps[i].regs);
    free(b.warps);
    free(b.shared);
    free(b.sh_epoch);
    free(b.sh_writer);
    free(b.sh_reader);
    free(b.sh_init);
    free(sectors.keys);
    free(sectors.flags);
    free(sectors.written);
    return r->code;
}
