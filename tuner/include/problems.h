/*
 * problems.h - the problem sets the tuner knows by name (presets) and the
 * problems-file format.
 *
 * A problems file has one problem a line; '#' starts a comment:
 *
 *   # op  dtype  d     n  heads form     epilogue  T buckets
 *   mix   bf16   7168  9  1     replace  0         1,64,4096
 *
 * Each line becomes one tuning problem per T bucket. The Block AttnRes
 * phases (and their backwards, phase1_backward and phase2_backward, which
 * take the same fields) take options after the buckets: `s=S` (phase1:
 * sites per block) and `fuse=1` (phase2: add the sublayer output into b
 * first):
 *
 *   phase1 bf16  7168  8  1     replace  0         1,64   s=24
 *   phase2 bf16  7168  1  1     replace  0         1,64   fuse=1
 *
 * docs/problems.md is the full description (every field's range, what is
 * refused); tests/tuner/test_problems.c keeps the two in step.
 */
#ifndef TUNER_PROBLEMS_H
#define TUNER_PROBLEMS_H

#include <stddef.h>
#include <stdint.h>

#include "attnres.h"

#define PROBLEM_MAX_BUCKETS 8

/* What a user may ask for, on the command line and in problems files: the
 * limits of attnres.h, which the runtime's plans and miss file share. They
 * lie far above every model (DESIGN §1: d <= 7168, N <= 73, T up to
 * 16384+) but keep every value inside the 32-bit fields of attnres_problem
 * and every buffer size inside 64 bits, so nothing is ever truncated. */
#define PROBLEM_MAX_D ATTNRES_MAX_D         /* row width d */
#define PROBLEM_MAX_N ATTNRES_MAX_N         /* sources N */
#define PROBLEM_MAX_HEADS ATTNRES_MAX_HEADS /* heads H */
#define PROBLEM_MAX_S ATTNRES_MAX_S         /* phase1 sites per block S */
#define PROBLEM_MAX_T (1 << 24)             /* tokens T of a bucket: the miss file's AR_MISS_MAX_T */

typedef struct tune_problem {
    attnres_problem p;
    int64_t t; /* the T bucket */
} tune_problem;

typedef struct problem_set {
    tune_problem *items;
    size_t count;
} problem_set;

/* Names of the presets, NULL-terminated, for help texts. */
extern const char *const preset_names[];

/* Expands a preset for a backend ("cpu" presets use T buckets a CPU can
 * time in seconds). Returns -1 with a message for an unknown name. */
int problems_preset(const char *name, const char *backend, problem_set *out, char *err, size_t err_len);

/* Reads a problems file (docs/problems.md). 0 on success; on failure -1, a
 * message "PATH:LINE: what is wrong" in err and an empty set. Never prints. */
int problems_read_file(const char *path, problem_set *out, char *err, size_t err_len);

/* Reads a miss file the runtime wrote (attnres_miss_file_set,
 * ATTNRES_MISS_FILE; format in runtime/src/miss_file.h): one tuning problem
 * per distinct recorded problem and T bucket, whatever device recorded it.
 * *torn counts the lines skipped as cut short; *other counts the
 * lines recorded on a device whose fingerprint is not `fingerprint`.
 * Errors as problems_read_file ("PATH:LINE: ..."); an empty file is one. */
int problems_read_misses(const char *path, const char *fingerprint, problem_set *out, int *torn, size_t *other,
                         char *err, size_t err_len);

void problems_free(problem_set *s);

/* "mix bf16 d=7168 N=9 H=1 replace T=4096" */
void problem_describe(const tune_problem *tp, char *buf, size_t len);

/* Bytes one launch must move (DESIGN §2): what ceiling fractions use. */
double problem_bytes(const tune_problem *tp);

/* The same bytes split into those read and those written: which ceiling a
 * kernel is held to depends on the mix (docs/design.md §2). */
void problem_traffic(const tune_problem *tp, double *read_bytes, double *write_bytes);

/* The arithmetic of one launch in flop, where it rather than memory bounds
 * the op: phase 1 (S dot products and S mixes per element read, and the
 * sum of squares) and its backward (per element and site two dots and
 * three multiply-adds), 0 for the others. */
double problem_flops(const tune_problem *tp);

/* The operation's name: "mix", "phase1", "phase2", "mix_backward",
 * "phase1_backward" or "phase2_backward" (the runtime's ar_op_name). */
const char *problem_op_name(attnres_op op);

/* The operation of a name problem_op_name gives; 0, or -1 for another
 * name (or NULL). */
int problem_op_parse(const char *name, attnres_op *op);

/* The form recorded in the database: "replace" or "additive" for mix;
 * phase2 with the sublayer add fused records "fused". */
const char *problem_form_name(const attnres_problem *p);

#endif
