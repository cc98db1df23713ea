/* api_basics.c - status text, version, dtypes and problem checking. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "attnres.h"
#include "device.h"

const char *attnres_errstr(int status)
{
    switch (status) {
    case ATTNRES_OK: return "success";
    case ATTNRES_EINVAL: return "invalid argument";
    case ATTNRES_ENOMEM: return "out of memory";
    case ATTNRES_ENODEV: return "no such device";
    case ATTNRES_EDB: return "database cannot be used";
    case ATTNRES_EDBVERSION: return "database schema is newer than this library";
    case ATTNRES_ENOTFOUND: return "no tuned kernel matches";
    case ATTNRES_ECOMPILE: return "kernel compilation failed";
    case ATTNRES_ELOAD: return "kernel could not be loaded";
    case ATTNRES_ELAUNCH: return "kernel launch failed";
    case ATTNRES_EUNSUPPORTED: return "not supported on this device or build";
    case ATTNRES_EIO: return "input/output error";
    case ATTNRES_EMISMATCH: return "arguments do not match the plan";
    default: return "unknown status code";
    }
}

const char *attnres_version(void) { return ATTNRES_VERSION_STRING; }

size_t attnres_dtype_size(attnres_dtype dtype)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32: return 4;
    case ATTNRES_DTYPE_BF16: return 2;
    case ATTNRES_DTYPE_F16: return 2;
    }
    return 0;
}

const char *attnres_dtype_name(attnres_dtype dtype)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32: return "f32";
    case ATTNRES_DTYPE_BF16: return "bf16";
    case ATTNRES_DTYPE_F16: return "f16";
    }
    return "unknown";
}

int attnres_dtype_parse(const char *name, attnres_dtype *out)
{
    static const attnres_dtype all[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16,
                                        ATTNRES_DTYPE_F16};
    if (!out)
        return ATTNRES_EINVAL;
    for (size_t i = 0; name && i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, attnres_dtype_name(all[i])) == 0) {
            *out = all[i];
            return ATTNRES_OK;
        }
    return ATTNRES_EINVAL;
}

void attnres_problem_init(attnres_problem *p, attnres_dtype dtype, int64_t d,
                          int32_t n)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->op = ATTNRES_OP_MIX;
    p->dtype = dtype;
    p->d = d;
    p->n = n;
    p->heads = 1;
    p->form = ATTNRES_FORM_REPLACE;
    p->epilogue = 0;
}

/* The fields that only the two-phase ops use: S for phase1, fuse_add for
 * phase2; each must be 0 for the other ops so that keys stay canonical. */
static int check_phase_fields(const attnres_problem *p, char *msg, size_t msg_len)
{
    const char *op = ar_op_name(p->op);
    /* A backward's fields are its forward's. */
    const attnres_op fwd = ar_op_forward(p->op);
    if (fwd == ATTNRES_OP_PHASE1) {
        if (p->s < 1 || p->s > ATTNRES_MAX_S) {
            snprintf(msg, msg_len, "%s needs S (sites of the block) between 1 and %d (ATTNRES_MAX_S; got %d)",
                     op, ATTNRES_MAX_S, p->s);
            return ATTNRES_EINVAL;
        }
    } else if (p->s != 0) {
        snprintf(msg, msg_len, "S = %d is only meaningful for phase1 and its backward; it must be 0 for %s", p->s, op);
        return ATTNRES_EINVAL;
    }
    if (p->fuse_add != 0 && p->fuse_add != 1) {
        snprintf(msg, msg_len, "fuse_add must be 0 or 1 (got %d)", p->fuse_add);
        return ATTNRES_EINVAL;
    }
    if (p->fuse_add && fwd != ATTNRES_OP_PHASE2) {
        snprintf(msg, msg_len, "fuse_add is only meaningful for phase2 and its backward, not %s", op);
        return ATTNRES_EINVAL;
    }
    if (fwd != ATTNRES_OP_MIX && p->form != ATTNRES_FORM_REPLACE) {
        snprintf(msg, msg_len, "%s has no additive form (Block AttnRes replaces)", op);
        return ATTNRES_EINVAL;
    }
    if (fwd == ATTNRES_OP_PHASE1 && p->epilogue) {
        snprintf(msg, msg_len, "%s has no output-norm epilogue (phase2 has)", op);
        return ATTNRES_EINVAL;
    }
    return ATTNRES_OK;
}

int attnres_problem_check(const attnres_problem *p, char *msg, size_t msg_len)
{
    char scratch[8];
    if (!msg) {
        msg = scratch;
        msg_len = sizeof scratch;
    }
    attnres_problem own;
    if (ar_problem_adopt(p, &own, msg, msg_len) != ATTNRES_OK)
        return ATTNRES_EINVAL;
    p = &own;
    if ((int)p->op < 0 || (int)p->op >= AR_OPS) {
        snprintf(msg, msg_len, "unknown op %d (mix, phase1, phase2, mix_backward, phase1_backward or phase2_backward)",
                 (int)p->op);
        return ATTNRES_EINVAL;
    }
    if (attnres_dtype_size(p->dtype) == 0) {
        snprintf(msg, msg_len, "unknown dtype %d", (int)p->dtype);
        return ATTNRES_EINVAL;
    }
    if (p->d < 1) {
        snprintf(msg, msg_len, "d must be at least 1 (got %lld)", (long long)p->d);
        return ATTNRES_EINVAL;
    }
    if (p->d > ATTNRES_MAX_D) {
        snprintf(msg, msg_len, "d = %lld is more than ATTNRES_MAX_D = %d", (long long)p->d, ATTNRES_MAX_D);
        return ATTNRES_EINVAL;
    }
    if (p->n < 1) {
        snprintf(msg, msg_len, "N (number of sources) must be at least 1 (got %d)", p->n);
        return ATTNRES_EINVAL;
    }
    if (p->n > ATTNRES_MAX_N) {
        snprintf(msg, msg_len, "N = %d sources is more than ATTNRES_MAX_N = %d", p->n, ATTNRES_MAX_N);
        return ATTNRES_EINVAL;
    }
    if (p->heads > ATTNRES_MAX_HEADS) {
        snprintf(msg, msg_len, "heads H = %d is more than ATTNRES_MAX_HEADS = %d", p->heads, ATTNRES_MAX_HEADS);
        return ATTNRES_EINVAL;
    }
    if (p->heads < 1 || p->d % p->heads != 0) {
        snprintf(msg, msg_len, "heads H = %d must be >= 1 and divide d = %lld",
                 p->heads, (long long)p->d);
        return ATTNRES_EINVAL;
    }
    if (p->form != ATTNRES_FORM_REPLACE && p->form != ATTNRES_FORM_ADDITIVE) {
        snprintf(msg, msg_len, "unknown form %d", (int)p->form);
        return ATTNRES_EINVAL;
    }
    if (p->epilogue != 0 && p->epilogue != 1) {
        snprintf(msg, msg_len, "epilogue must be 0 or 1 (got %d)", p->epilogue);
        return ATTNRES_EINVAL;
    }
    return check_phase_fields(p, msg, msg_len);
}

int ar_struct_size_check(size_t got, size_t oldest, size_t want, const char *type, const char *init, char *msg,
                         size_t msg_len)
{
    if (got >= oldest && got <= want)
        return 0;
    snprintf(msg, msg_len,
             "%s.struct_size is %zu, but this library (attnres %s) takes %zu to %zu (the sizes since 0.2.0): fill "
             "it with %s, or build against an attnres.h of 0.2.0 or later",
             type, got, ATTNRES_VERSION_STRING, oldest, want, init);
    return 1;
}

void ar_struct_adopt(const void *src, void *dst, size_t want)
{
    size_t got = *(const size_t *)src;
    memcpy(dst, src, got < want ? got : want);
    *(size_t *)dst = want;
}

int ar_problem_adopt(const attnres_problem *p, attnres_problem *out, char *msg, size_t msg_len)
{
    if (!p) {
        snprintf(msg, msg_len, "problem is NULL");
        return ATTNRES_EINVAL;
    }
    if (ar_struct_size_check(p->struct_size, AR_PROBLEM_SIZE_0_2, sizeof *p, "attnres_problem",
                             "attnres_problem_init", msg, msg_len))
        return ATTNRES_EINVAL;
    memset(out, 0, sizeof *out);
    ar_struct_adopt(p, out, sizeof *out);
    return ATTNRES_OK;
}

/* Every op's argument struct starts zeroed, carries its own size, and has
 * the same scale and eps defaults; the _init functions add the rest. */
#define ARGS_RESET(a)                                                                                                  \
    do {                                                                                                               \
        memset((a), 0, sizeof *(a));                                                                                   \
        (a)->struct_size = sizeof *(a);                                                                                \
        (a)->scale = 1.0f;                                                                                             \
        (a)->eps = 1e-6f;                                                                                              \
    } while (0)

void attnres_mix_args_init(attnres_mix_args *a)
{
    if (!a)
        return;
    ARGS_RESET(a);
    a->alpha = 1.0f;
    a->out_eps = 1e-6f;
}

void attnres_fold_query(const float *w, const float *gain, float *u, int64_t d)
{
    if (!w || !u)
        return;
    for (int64_t k = 0; k < d; k++)
        u[k] = gain ? gain[k] * w[k] : w[k];
}

void attnres_phase1_args_init(attnres_phase1_args *a)
{
    if (!a)
        return;
    ARGS_RESET(a);
}

void attnres_phase2_args_init(attnres_phase2_args *a)
{
    if (!a)
        return;
    ARGS_RESET(a);
    a->out_eps = 1e-6f;
}

void attnres_mix_backward_args_init(attnres_mix_backward_args *a)
{
    if (!a)
        return;
    ARGS_RESET(a);
    a->alpha = 1.0f;
    a->out_eps = 1e-6f;
}

void attnres_phase1_backward_args_init(attnres_phase1_backward_args *a)
{
    if (!a)
        return;
    ARGS_RESET(a);
}

void attnres_phase2_backward_args_init(attnres_phase2_backward_args *a)
{
    if (!a)
        return;
    ARGS_RESET(a);
    a->out_eps = 1e-6f;
}
