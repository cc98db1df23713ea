/*
 * row_lines.h - the vector of bf16 words that the row-moving loops of
 * bench/phase1_kernel.c, bench/phase2_kernel.c and
 * bench/mix_backward_kernel.c (their builds without a kernel) read and
 * write a row in.
 */
#ifndef ATTNRES_BENCH_ROW_LINES_H
#define ATTNRES_BENCH_ROW_LINES_H

#include <stdint.h>

/* bf16 words in the widest vector the target loads (64 bytes with AVX-512,
 * 32 with AVX2: a 64-byte GNU C vector without AVX-512 lives on the stack). */
#if defined(__AVX512F__)
#define VEC_WORDS 32
#else
#define VEC_WORDS 16
#endif
typedef uint16_t line_t __attribute__((vector_size(2 * VEC_WORDS), may_alias, aligned(1)));
#define LINE(p) (*(line_t *)(void *)(p))

#endif
