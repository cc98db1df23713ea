/*
 * core_ops_internal.h - what the hot-path method files share: core_ops.c
 * (Plan.mix, Plan.phase1, Plan.phase2, Plan.mix_backward and Plan._time_c)
 * and core_phase_backward.c (Plan.phase1_backward, Plan.phase2_backward).
 * The argument tables and their types, and core_ops.c's helpers for
 * parsing a call, its scalars, its outputs, the timed run and the plan's
 * scratch. Private to the extension, like core_internal.h, which it
 * includes first.
 */
#ifndef ATTNRES_CORE_OPS_INTERNAL_H
#define ATTNRES_CORE_OPS_INTERNAL_H

#include "core_internal.h"

#include <stddef.h>
#include <stdint.h>

/* What an argument is. */
enum {
    K_FLOAT,  /* a float scalar, stored at off */
    K_STREAM, /* the CUDA stream; resolved before any array is borrowed */
    K_BANK,   /* count [T, width] views, one (count, T, width) array or a sequence:
               * the pointer array at off, the token strides at aux */
    K_ROWS,   /* one [T, width] view: the pointer at off, its token stride at aux */
    K_QUERY,  /* a dense fp32 [d] (or [S, d] with F_SITES), folded with the gain
               * in slot `partner`; the folded pointer at off */
    K_GAIN,   /* the gain of a K_QUERY, read there */
    K_VEC,    /* a dense fp32 [d] vector (out_gain) at off */
};

/* When an argument applies. Outside its condition it is refused if given. */
enum { W_ALWAYS, W_ADDITIVE, W_EPILOGUE, W_FUSE_ADD };

/* "form='additive'" and so on: what a plan needs for an argument of each W_. */
extern const char *const when_needs[];

enum {
    F_REQUIRED = 1 << 0,  /* must be given where it applies */
    F_OUT = 1 << 1,       /* an output: allocated when omitted, borrowed after every input */
    F_F32 = 1 << 2,       /* fp32 rather than the plan's storage type */
    F_HEADS = 1 << 3,     /* width H rather than d */
    F_SITES = 1 << 4,     /* count (or rows) S rather than n (or 1) */
    F_COMMON = 1 << 5,    /* a bank whose views share one token stride, one int64_t at aux */
    F_POSITIVE = 1 << 6,  /* a float that must be > 0 */
    F_FUSED_OUT = 1 << 7, /* an input that the fused add writes in place */
};

typedef struct {
    const char *name;
    PyObject *interned;
    unsigned char kind, when;
    unsigned short flags;
    double dflt;   /* K_FLOAT: the default */
    int partner;   /* K_QUERY: the slot of its gain */
    size_t off;    /* byte offset of the member the value goes to */
    size_t aux;    /* byte offset of the stride member(s) */
} arg_spec;

#define MAX_ARGS 24

typedef union {
    attnres_mix_args mix;
    attnres_phase1_args p1;
    attnres_phase2_args p2;
} run_args;

/* An attnres_run_ call on a plan, T tokens, the op's args and a stream. */
typedef int (*run_fn)(attnres_plan *, int64_t, const void *, void *);

typedef struct {
    const char *fn;
    attnres_op op;
    int npos;      /* the leading arguments that may be positional */
    int nargs;
    arg_spec *args;
    void (*init)(run_args *);
    run_fn run;    /* takes the op's member of a run_args */
    int result[2]; /* the slots returned: one object, or a pair when the second applies */
    int nreq;      /* the leading arguments that must be given; 0 means all npos */
} op_spec;

/* The runtime's op names, in attnres_op order. */
extern const char *const op_names[];

/* Matches positional and keyword arguments to slots: the first npos names
 * may be given by position, and the first nreq (npos when 0) must be given.
 * Slots left unset hold NULL. */
int parse_args(const op_spec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **slots);
/* A slot's value, Py_None when unset. */
PyObject *opt(PyObject *slot);
/* A float argument: finite, within float range, and positive if asked. */
int get_float(PyObject *slot, const char *name, double dflt, int positive, float *out);
/* Whether an argument of condition `when` (W_) applies to the problem. */
int applies(const attnres_problem *p, int when);
/* Runs once, or with repeat > 0 that many times, adding the wall and this
 * thread's CPU time (ns) to *wall and *cpu; takes no Python object. */
int run_timed(run_fn run, attnres_plan *plan, int64_t t, const void *args, void *stream, long repeat, double *wall,
              double *cpu);
/* 64-byte aligned scratch of `bytes`: the plan's (scratch_busy set; the
 * caller clears it), or, while another call has it, one of the call's own,
 * returned in *own for the caller to free. NULL with an exception set. */
void *lend_scratch(PlanObject *self, size_t bytes, void **own);
/* A writable dense fp32 vector of `len` elements. */
int borrow_f32_out(call_ctx *c, PyObject *obj, const char *name, int64_t len, view *v);
/* An output array: the caller's (given is not Py_None), or a new one like `like`. */
PyObject *out_or_new(call_ctx *c, PyObject *given, PyObject *like, const char *dtype, int ndim, int64_t a, int64_t b,
                     int64_t d);
size_t round_up64(size_t n);

/* ---- the phase backwards (core_phase_backward.c) ---- */

/* Their argument tables, whose names ops_intern_names interns. */
extern const op_spec phase1_backward_spec, phase2_backward_spec;
/* The bodies of Plan.phase1_backward and Plan.phase2_backward; with repeat
 * > 0 (Plan._time_c) the mean (wall, CPU) ns per run instead. */
PyObject *call_phase1_backward(PlanObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               long repeat);
PyObject *call_phase2_backward(PlanObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               long repeat);

#endif
