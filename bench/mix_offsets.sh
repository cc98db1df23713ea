#!/usr/bin/env bash
# bench/mix_offsets.sh SHAPE VARIANT... - bf16 CPU mix kernels on sources
# that share their offset within a page (the rows of one bank, as the tuner
# lays them out) and on sources shifted a cache line apart
# (SOURCE_OFFSET=64 of bench/mix_kernel.c), next to the read-only loop, in
# interleaved rounds; prints per binary and offset the median GB/s and
# every round, sorted. SHAPE is mix_kernel's arguments in quotes:
# "D T N THREADS REPEATS [HEADS]".
#
#   bash bench/mix_offsets.sh "4096 4096 9 2 1 8" mix_c_bf16_fused_v16_g4_b4_pb_dbf16_sc_t2
#
# ROUNDS (default 9) sets the rounds, BUILD_DIR (default build/) the
# attnres whose `gen` writes the kernels, OFFSETS (default "0 64") the
# offsets in bytes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/variant_bench.sh"
bench_args 2 "\"D T N THREADS REPEATS [HEADS]\" VARIANT..." "$@"
shape=$1
shift
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
rounds=${ROUNDS:-9}
case $rounds in '' | *[!0-9]* | 0) echo "$0: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
offsets=${OFFSETS:-0 64}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc=${CC:-cc}

# The read-only loop takes its argument struct from the build's kernel_abi.h.
"$cc" -O3 -march=native -pthread -I"$build/runtime/include" "$root/bench/mix_kernel.c" -o "$work/read_only"
bins=(read_only)
for id in "$@"; do
  bench_variant "$build" "$id" "$work/$id" "$root/bench/mix_kernel.c"
  bins+=("$id")
done

# shellcheck disable=SC2086 # the shape and the offsets are lists
for _ in $(seq "$rounds"); do
  for off in $offsets; do
    for bin in "${bins[@]}"; do
      echo "$bin offset=$off $(cd "$work" && SOURCE_OFFSET=$off "./$bin" $shape | awk '{print $(NF-1)}')"
    done
  done
done | sort -k1,2 -k3n | awk '
  { key = $1 " " $2; v[key] = v[key] " " $3 }
  END { for (k in v) { n = split(v[k], a, " "); split(k, b, " ");
          printf "%-48s %-11s %6s GB/s  (%s )\n", b[1], b[2], a[int((n + 1) / 2)], v[k] } }' | sort
echo "($rounds rounds of: SOURCE_OFFSET=B mix_kernel $shape, B in: $offsets)"
