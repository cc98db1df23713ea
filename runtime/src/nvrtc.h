/*
 * nvrtc.h - NVRTC, loaded at run time with dlopen (no link-time dependency).
 *
 * The library is searched as libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so,
 * then in $CUDA_HOME/lib64, $CUDA_PATH/lib64 and /usr/local/cuda/lib64. It
 * is loaded once per process; every function here is safe to call from
 * several threads at once (the tuner compiles in parallel). Nothing here
 * prints, aborts or exits: failures come back as a status and a message.
 */
#ifndef AR_NVRTC_H
#define AR_NVRTC_H

#include <stddef.h>

/* What ptxas reported for one kernel (from --verbose); -1 where unknown. */
typedef struct ar_resources {
    int registers;
    int spill_stores; /* bytes */
    int spill_loads;  /* bytes */
    int smem;         /* static shared memory, bytes */
    int stack;        /* stack frame, bytes */
    /* {"registers":N,"spill_stores":N,"spill_loads":N,"smem":N,"stack":N} */
    char json[160];
} ar_resources;

/* The options every compile passes besides the architecture; part of the
 * build key (DESIGN §4). */
#define AR_NVRTC_OPTIONS "-std=c++17 -default-device --fmad=true -Xptxas --verbose"

/* 0 when NVRTC can be loaded; otherwise -1 and the reason in err. */
int ar_nvrtc_available(char *err, size_t errlen);

/* The loaded NVRTC's version. 0, or -1 when NVRTC is not available. */
int ar_nvrtc_version(int *major, int *minor);

/* "NVRTC 13.0" (or "NVRTC unavailable") into buf. */
void ar_nvrtc_identity(char *buf, size_t len);

/* The highest architecture NVRTC can compile real code for that is not
 * above want ("sm_90" for want 90); 0 when none or unknown. */
int ar_nvrtc_best_arch(int want);

/*
 * Compiles one CUDA C++ translation unit.
 *   source     the text; name is its file name in messages ("kernel.cu").
 *   arch       "sm_90" (or "compute_90" / "90"): with want_cubin the result
 *              is an ELF cubin for sm_XX, else PTX for compute_XX (PTX is
 *              NUL-terminated and *size counts the NUL).
 *   blob/size  the result, malloc'ed, owned by the caller (may be NULL when
 *              only the log and resources are wanted).
 *   log        the compiler's log, malloc'ed (NULL if empty); may be NULL.
 *   res        filled from the ptxas report when want_cubin (may be NULL):
 *              the most of each figure over the module's entries
 *              (ar_nvrtc_parse_module_resources).
 * Returns ATTNRES_OK, ATTNRES_EUNSUPPORTED (NVRTC missing), ATTNRES_ENOMEM,
 * or ATTNRES_ECOMPILE (the source or an option was refused; see err/log).
 */
int ar_nvrtc_compile(const char *source, const char *name, const char *arch,
                     int want_cubin, void **blob, size_t *size, char **log,
                     ar_resources *res, char *err, size_t errlen);

/* Parses a ptxas --verbose report. kernel selects the entry function
 * (NULL: the first one). Returns 0 if a report for it was found. */
int ar_nvrtc_parse_resources(const char *log, const char *kernel,
                             ar_resources *res);
/* The same over every entry function the report names: the most
 * registers, spill bytes, stack and shared memory of any of them, so that
 * a module with several entries (the backwards' _epi and _sum) is judged
 * by its worst. Returns 0 if at least one entry's report was found. */
int ar_nvrtc_parse_module_resources(const char *log, ar_resources *res);

#endif
