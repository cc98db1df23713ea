#!/usr/bin/env bash
# bench/mix_kernels.sh [BUILD_DIR] - the bf16 CPU mix kernels side by side in
# one run (bench/mix_kernel.c), for docs/cpu_kernels.md:
#   - from memory: K3 shape (d = 7168, N = 9, T = 4096) on 1 and 2 threads;
#   - from L2: d = 2048, N = 9, T = 32, one thread, 200 launches in a row;
# for the read-only kernel, the pipelined schedule of cpu/mix.lua and the
# fused template: without prefetch, with each prefetch form, with the bf16
# dot products and with non-temporal stores. Needs a built attnres; the
# 16-lane variants compile to pairs of AVX2 operations on a CPU without
# AVX-512, and the bf16 dot variants to their FMA form without AVX512-BF16.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/variant_bench.sh"
build=$(cd "${1:-$root/build}" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export ATTNRES_TEMPLATE_DIR=$root/templates
cc=${CC:-cc}

# The read-only loop takes its argument struct from the build's kernel_abi.h.
"$cc" -O3 -march=native -pthread -I"$build/runtime/include" "$root/bench/mix_kernel.c" -o "$work/read_only"
bins=("$work/read_only")
for id in mix_c_bf16_pipelined_v16_u1_t2 mix_c_bf16_fused_v16_g8_pn_dfma_sc_t2 \
  mix_c_bf16_fused_v16_g8_pt_dfma_sc_t2 mix_c_bf16_fused_v16_g8_pt_dbf16_sc_t2 mix_c_bf16_fused_v16_g8_pt_dbf16_ss_t2 \
  mix_c_bf16_fused_v16_g8_pb_dbf16_ss_t2; do
  bench_variant "$build" "$id" "$work/$id" "$root/bench/mix_kernel.c"
  bins+=("$work/$id")
done
echo "== from memory: d = 7168, T = 4096, N = 9"
for threads in 1 2; do
  for bin in "${bins[@]}"; do (cd "$work" && "./$(basename "$bin")" 7168 4096 9 "$threads" 1); done
done
echo "== from L2: d = 2048, T = 32, N = 9, one thread, 200 launches"
for bin in "${bins[@]}"; do (cd "$work" && "./$(basename "$bin")" 2048 32 9 1 200); done
