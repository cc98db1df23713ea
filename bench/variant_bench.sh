# variant_bench.sh - sourced by the bench scripts that time generated
# variants in a harness of bench/ (mix_kernel.c, phase1_kernel.c,
# phase2_kernel.c): the build of one variant's timing binary, the same for
# each of them so that their numbers compare.
#
# bench_args MIN USAGE ARGS...: exits 2 after printing "usage: SCRIPT
# USAGE" when fewer than MIN arguments follow.
bench_args() {
  local min=$1 usage=$2
  shift 2
  if [ $# -lt "$min" ]; then
    echo "usage: $0 $usage" >&2
    exit 2
  fi
}

# bench_variant BUILD_DIR ID OUT HARNESS [CFLAGS...]: writes the source of
# variant ID (`attnres gen` of BUILD_DIR, from the caller's
# ATTNRES_TEMPLATE_DIR) to OUT.c, and compiles HARNESS around it into OUT
# with $CC (default cc) and CFLAGS.
bench_variant() {
  local build=$1 id=$2 out=$3 harness=$4 kernel
  shift 4
  "$build/bin/attnres" gen "$id" >"$out.c"
  # The entry point as the generated file names it (CPU kernels are named
  # without their thread count, which is set at launch; older ones with it).
  kernel=$(sed -n 's/^void \(attnres_[A-Za-z0-9_]*\)(.*/\1/p' "$out.c" | head -n 1)
  "${CC:-cc}" -O3 -march=native -pthread "$@" -DKERNEL_SOURCE="\"$out.c\"" -DKERNEL="$kernel" "$harness" \
    -o "$out" -lm
}
