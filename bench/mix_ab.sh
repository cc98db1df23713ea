#!/usr/bin/env bash
# bench/mix_ab.sh REV SHAPE VARIANT... - a template change measured as a
# ratio within one run: each bf16 CPU mix VARIANT generated from the
# templates of git revision REV ("before") and from the working tree
# ("after"), built into bench/mix_kernel.c, and timed in interleaved rounds
# next to the read-only loop; prints per binary the median GB/s and every
# round, sorted. SHAPE is mix_kernel's arguments in quotes:
# "D T N THREADS REPEATS [HEADS]". Phase 2 variants (phase2_c_bf16_...) go
# into bench/phase2_kernel.c instead, next to its row-moving loop, with
# its arguments as SHAPE: "D T THREADS NORM"; phase 1 variants
# (phase1_c_bf16_...) into bench/phase1_kernel.c, next to its row-moving
# loop, with "D T N S THREADS REPEATS [HEADS]"; mix backward variants
# (mix_backward_c_...) into bench/mix_backward_kernel.c, next to its loop
# that moves the same bytes, with "D T N THREADS REPEATS [HEADS]" (T a
# multiple of 32 * THREADS); one run takes one op.
#
#   bash bench/mix_ab.sh HEAD~3 "4096 1 9 1 2000 8" mix_c_bf16_fused_v16_g4_pt_dfma_ss_t1
#   bash bench/mix_ab.sh HEAD~1 "7168 16384 2 0" phase2_c_bf16_v16_u2_p1_ss_t2
#   bash bench/mix_ab.sh HEAD~1 "7168 1 8 24 1 200" phase1_c_bf16_tiled_tiled_v16_u1_t1
#   bash bench/mix_ab.sh HEAD "7168 4096 9 2 1" mix_backward_c_bf16_v8_u2_t2
#
# Mix and mix backward variants of one dtype per run: f32 and f16 ones build
# the harness with that element type. PARTIAL=1 or NORM=1 in the environment reach the mix
# harness (the additive form, the output norm; the read-only loop reads the
# partial row as one more source and runs without the norm). READ_GROUP=G
# builds the read-only loop to read the rows G at a time, as the statistics
# sweeps of G rows do (mix_kernel.c).
# REV "-" times the variants from the working tree alone, once each: a
# comparison of variants rather than of revisions.
# ROUNDS (default 9) sets the rounds, BUILD_DIR (default build/) the
# attnres whose `gen` writes the kernels. A shared host's neighbours shift
# every binary of a round alike; compare the medians of one run, not runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/bench/variant_bench.sh"
bench_args 3 "REV \"D T N THREADS REPEATS [HEADS]\" VARIANT..." "$@"
rev=$1 shape=$2
shift 2
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
rounds=${ROUNDS:-9}
case $rounds in '' | *[!0-9]* | 0) echo "$0: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc=${CC:-cc}

sides="before after"
if [ "$rev" = - ]; then
  sides=after
else
  mkdir -p "$work/before"
  git -C "$root" archive "$rev" templates | tar -x -C "$work/before"
fi
harness=mix_kernel.c reference=read_only
case $1 in
  phase2_*) harness=phase2_kernel.c reference=move_rows ;;
  phase1_*) harness=phase1_kernel.c reference=move_rows ;;
  mix_backward_*) harness=mix_backward_kernel.c reference=move_rows ;;
esac
# The mix and mix backward harnesses store the variants' element type (bf16
# unless named).
elem_of() {
  case $1 in
    mix_c_f32_* | mix_backward_c_f32_*) echo -DELEM_F32 ;;
    mix_c_f16_* | mix_backward_c_f16_*) echo -DELEM_F16 ;;
    *) echo -DELEM_BF16 ;;
  esac
}
elem=$(elem_of "$1")
for id in "$@"; do
  case $id in
    phase2_*) [ $harness = phase2_kernel.c ] ;;
    phase1_*) [ $harness = phase1_kernel.c ] ;;
    mix_backward_*) [ $harness = mix_backward_kernel.c ] && [ "$(elem_of "$id")" = "$elem" ] ;;
    *) [ $harness = mix_kernel.c ] && [ "$(elem_of "$id")" = "$elem" ] ;;
  esac || { echo "$0: $id: one run takes the variants of one op and one dtype" >&2; exit 2; }
done
group=
if [ -n "${READ_GROUP:-}" ]; then
  case $READ_GROUP in *[!0-9]* | 0) echo "$0: READ_GROUP must be a positive integer" >&2; exit 2 ;; esac
  group=-DREAD_GROUP=$READ_GROUP
fi
# shellcheck disable=SC2086 # empty or one flag
# The reference loop takes its argument struct from the build's kernel_abi.h.
"$cc" -O3 -march=native -pthread -I"$build/runtime/include" "$elem" $group "$root/bench/$harness" \
  -o "$work/$reference" -lm
bins=("$reference")
for id in "$@"; do
  for side in $sides; do
    templates=$root/templates
    [ "$side" = before ] && templates=$work/before/templates
    ATTNRES_TEMPLATE_DIR=$templates bench_variant "$build" "$id" "$work/$side-$id" "$root/bench/$harness" "$elem"
    bins+=("$side-$id")
  done
done

# shellcheck disable=SC2086 # the shape is a list of arguments
for _ in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    # The read-only loop writes no normed row: it runs without NORM.
    if [ "$bin" = read_only ]; then
      echo "$bin $(cd "$work" && env -u NORM "./$bin" $shape | awk '{print $(NF-1)}')"
    else
      echo "$bin $(cd "$work" && "./$bin" $shape | awk '{print $(NF-1)}')"
    fi
  done
done | sort -k1,1 -k2n | awk '
  { v[$1] = v[$1] " " $2; c[$1]++ }
  END { for (b in v) { n = split(v[b], a, " "); printf "%-56s %6s GB/s  (%s )\n", b, a[int((n + 1) / 2)], v[b] } }' | sort
if [ "$rev" = - ]; then
  echo "(after: the working tree; $rounds rounds of: ${harness%.c} $shape)"
else
  echo "(before: templates of $rev; after: the working tree; $rounds rounds of: ${harness%.c} $shape)"
fi
