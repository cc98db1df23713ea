/*
 * ptx_numerics.c - see ptx_numerics.h. Built with -frounding-math and
 * -ffp-contract=off (tests/cudasim/CMakeLists.txt).
 */
#include "ptx_numerics.h"

#include <fenv.h>
#include <math.h>
#include <string.h>

uint16_t num_f32_to_f16(float f)
{
    const uint32_t x = num_f32_bits(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax > 0x7f800000)
        return 0x7fff; /* the canonical NaN */
    if (ax >= 0x477ff000) /* 65520 and above round to infinity */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000) { /* below 2^-14: a subnormal (or zero) half */
        /* |f| * 2^24 is exact; rounding it to an integer rounds to a
         * multiple of 2^-24, the subnormal step, to nearest even. */
        float scaled = fabsf(f) * 16777216.0f;
        float r = nearbyintf(scaled);
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t t = ax - (112u << 23); /* rebias the exponent from 127 to 15 */
    t += 0xfff + ((t >> 13) & 1);
    return (uint16_t)(sign | (t >> 13));
}

float num_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f)
        return num_f32_from_bits(sign | 0x7f800000 | (m << 13));
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f); /* exact */
        return sign ? -v : v;
    }
    return num_f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t num_f32_to_bf16(float f)
{
    const uint32_t x = num_f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000)
        return 0x7fff;
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float num_bf16_to_f32(uint16_t h)
{
    return num_f32_from_bits((uint32_t)h << 16);
}

float num_ftz(float f)
{
    const uint32_t x = num_f32_bits(f);
    if ((x & 0x7f800000) == 0)
        return num_f32_from_bits(x & 0x80000000);
    return f;
}

float num_sat(float f)
{
    if (isnan(f))
        return 0.0f;
    return f < 0.0f ? 0.0f : f > 1.0f ? 1.0f : f;
}

static int fe_mode(int rnd)
{
    switch (rnd) {
    case RND_RZ:
    case RND_RZI:
        return FE_TOWARDZERO;
    case RND_RM:
    case RND_RMI:
        return FE_DOWNWARD;
    case RND_RP:
    case RND_RPI:
        return FE_UPWARD;
    default:
        return FE_TONEAREST;
    }
}

/* Runs one expression under a rounding mode, restoring nearest-even. */
#define UNDER(rnd, expr)                                         \
    do {                                                         \
        const int mode_ = fe_mode(rnd);                          \
        if (mode_ != FE_TONEAREST)                               \
            fesetround(mode_);                                   \
        expr;                                                    \
        if (mode_ != FE_TONEAREST)                               \
            fesetround(FE_TONEAREST);                            \
    } while (0)

/* The four binary operations and fma of one floating type under one
 * rounding mode; volatile keeps the compiler from folding or moving the
 * operation across the mode switch. */
#define BINARY_AND_FMA(T, binary, fused, fma_fn)       \
    T binary(char op, T a, T b, int rnd)               \
    {                                                  \
        volatile T r = 0;                              \
        switch (op) {                                  \
        case '+':                                      \
            UNDER(rnd, r = a + b);                     \
            break;                                     \
        case '-':                                      \
            UNDER(rnd, r = a - b);                     \
            break;                                     \
        case '*':                                      \
            UNDER(rnd, r = a * b);                     \
            break;                                     \
        default:                                       \
            UNDER(rnd, r = a / b);                     \
            break;                                     \
        }                                              \
        return r;                                      \
    }                                                  \
    T fused(T a, T b, T c, int rnd)                    \
    {                                                  \
        volatile T r = 0;                              \
        UNDER(rnd, r = fma_fn(a, b, c));               \
        return r;                                      \
    }

BINARY_AND_FMA(float, num_f32_binary, num_f32_fma, fmaf)
BINARY_AND_FMA(double, num_f64_binary, num_f64_fma, fma)

float num_f32_sqrt(float a, int rnd)
{
    volatile float r = 0;
    UNDER(rnd, r = sqrtf(a));
    return r;
}

double num_f64_sqrt(double a, int rnd)
{
    volatile double r = 0;
    UNDER(rnd, r = sqrt(a));
    return r;
}

/* min (or max) of a and b as PTX defines both: a NaN operand yields the
 * other one (b when both are), and -0 is below +0. An f32 is exact as a
 * double, so both widths take it from here. */
static double min_max(double a, double b, int max)
{
    if (isnan(a))
        return b;
    if (isnan(b))
        return a;
    if (a == b)
        return (signbit(a) != 0) == (max != 0) ? b : a;
    return (a < b) != max ? a : b;
}

/* Two NaN operands give the f32 canonical NaN. */
float num_f32_min(float a, float b)
{
    return isnan(a) && isnan(b) ? num_f32_from_bits(0x7fffffff) : (float)min_max(a, b, 0);
}

float num_f32_max(float a, float b)
{
    return isnan(a) && isnan(b) ? num_f32_from_bits(0x7fffffff) : (float)min_max(a, b, 1);
}

double num_f64_min(double a, double b)
{
    return min_max(a, b, 0);
}

double num_f64_max(double a, double b)
{
    return min_max(a, b, 1);
}

double num_round_integral(double v, int rnd)
{
    switch (rnd) {
    case RND_RZI:
        return trunc(v);
    case RND_RMI:
        return floor(v);
    case RND_RPI:
        return ceil(v);
    default: {
        volatile double r = 0;
        UNDER(RND_RN, r = nearbyint(v));
        return r;
    }
    }
}

uint64_t num_float_to_int(double v, int rnd, ptx_type dst)
{
    if (isnan(v))
        return 0;
    double r = num_round_integral(v, rnd);
    const int bytes = ptx_type_bytes(dst);
    if (ptx_type_is_signed(dst)) {
        const double hi = ldexp(1.0, 8 * bytes - 1) - 1, lo = -ldexp(1.0, 8 * bytes - 1);
        int64_t i = r >= hi ? (int64_t)(bytes == 8 ? INT64_MAX : (int64_t)hi) : r <= lo ? (int64_t)lo : (int64_t)r;
        return bytes == 8 ? (uint64_t)i : (uint64_t)i & ((1ull << (8 * bytes)) - 1);
    }
    const double hi = bytes == 8 ? 18446744073709551615.0 : ldexp(1.0, 8 * bytes) - 1;
    if (r <= 0)
        return 0;
    if (r >= hi)
        return bytes == 8 ? UINT64_MAX : (uint64_t)hi;
    return (uint64_t)r;
}

/* An integer's conversion to one floating type under one rounding mode;
 * converting to double and then to float would round twice. */
#define INT_TO_FLOAT(T, name)                          \
    T name(uint64_t bits, int src_signed, int rnd)     \
    {                                                  \
        volatile T r = 0;                              \
        if (src_signed)                                \
            UNDER(rnd, r = (T)(int64_t)bits);          \
        else                                           \
            UNDER(rnd, r = (T)bits);                   \
        return r;                                      \
    }

INT_TO_FLOAT(float, num_int_to_f32)
INT_TO_FLOAT(double, num_int_to_f64)

float num_f64_to_f32(double v, int rnd)
{
    volatile float r = 0;
    UNDER(rnd, r = (float)v);
    return r;
}
