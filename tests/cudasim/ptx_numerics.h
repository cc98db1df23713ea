/*
 * ptx_numerics.h - arithmetic as the PTX ISA defines it, bit for bit.
 *
 * Rounding modes other than round-to-nearest-even are applied with the
 * C floating-point environment (this file is compiled with -frounding-math
 * and without contraction, so each C operation is one IEEE operation).
 * Narrowing to f16 and bf16 is done on the bits, rounding to nearest even.
 */
#ifndef CUDASIM_PTX_NUMERICS_H
#define CUDASIM_PTX_NUMERICS_H

#include <stdint.h>
#include <string.h>

#include "ptx.h"

/* An f32's or f64's bits and back: a register holds the bits, and the
 * narrowing conversions below work on them. */
static inline uint32_t num_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float num_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint64_t num_f64_bits(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline double num_f64_from_bits(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }

uint16_t num_f32_to_f16(float f);
float num_f16_to_f32(uint16_t h);
uint16_t num_f32_to_bf16(float f);
float num_bf16_to_f32(uint16_t h);

/* Flush a subnormal to a zero of the same sign (.ftz). */
float num_ftz(float f);
/* Clamp to [0, 1], NaN to 0 (.sat). */
float num_sat(float f);

/* a op b (op '+', '-', '*', '/') or fma, in f32 or f64, under a rounding
 * mode (RND_NONE and RND_RN round to nearest even). */
float num_f32_binary(char op, float a, float b, int rnd);
float num_f32_fma(float a, float b, float c, int rnd);
double num_f64_binary(char op, double a, double b, int rnd);
double num_f64_fma(double a, double b, double c, int rnd);
float num_f32_sqrt(float a, int rnd);
double num_f64_sqrt(double a, int rnd);

/* min/max as PTX defines them: a NaN operand yields the other one, and
 * -0 is below +0. */
float num_f32_min(float a, float b);
float num_f32_max(float a, float b);
double num_f64_min(double a, double b);
double num_f64_max(double a, double b);

/* Float to integer (cvt.rni/rzi/rmi/rpi), saturating to the destination
 * type's range, NaN to 0. Returns the bits zero-extended to 64. */
uint64_t num_float_to_int(double v, int rnd, ptx_type dst);
/* Round a float to an integral value of the same type (cvt.rni.f32.f32). */
double num_round_integral(double v, int rnd);
/* Integer to f32/f64 under a rounding mode; src_signed selects the view. */
float num_int_to_f32(uint64_t bits, int src_signed, int rnd);
double num_int_to_f64(uint64_t bits, int src_signed, int rnd);
/* f64 to f32 under a rounding mode. */
float num_f64_to_f32(double v, int rnd);

#endif
