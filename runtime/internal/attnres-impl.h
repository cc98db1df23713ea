/*
 * attnres-impl.h - the runtime's internal tier: what code built with the
 * library in this tree (the tuner, the command line) may use of libattnres
 * beyond the public attnres.h.
 *
 * The installed package never ships this header, and the shared library
 * does not export these symbols: they resolve only against the static
 * library (attnres_static) of the same build. The tuner reaches the
 * runtime's internals through this file alone, so that what it depends on
 * is named in one place; the headers of runtime/src stay private.
 *
 *   device.h  the device handle, its backend vtable, loaded kernels
 *             (ar_kernel) and launches of a kernel that is not in a plan;
 *   sha256.h  the hash of sources and build keys;
 *   storage_convert.h  fp32 to and from bf16 and f16, one element at a
 *             time (header-only);
 *   rmsnorm_backward.h  the output-norm epilogue's backward in fp64, which
 *             the tuner's mix backward bench case composes its reference
 *             with (header-only);
 *   binary_cache.h  compiled kernels on disk by build key, and their seal,
 *             which the tuner reads before it compiles;
 *   miss_file.h  the record of untuned problems the runtime writes, which
 *             `attnres tune --from-misses` reads back;
 *   nvrtc.h   NVRTC and the compiler's resource report. Its functions
 *             exist only where the CUDA backend is built, which
 *             ATTNRES_HAVE_CUDA says.
 */
#ifndef ATTNRES_IMPL_H
#define ATTNRES_IMPL_H

#include "../src/binary_cache.h"
#include "../src/device.h"
#include "../src/miss_file.h"
#include "../src/rmsnorm_backward.h"
#include "../src/sha256.h"
#include "../src/storage_convert.h"
#ifdef ATTNRES_HAVE_CUDA
#include "../src/nvrtc.h"
#endif

#endif
