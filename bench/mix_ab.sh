#!/usr/bin/env bash
# bench/mix_ab.sh REV SHAPE VARIANT... - a template change measured as a
# ratio within one run: each bf16 CPU mix VARIANT generated from the
# templates of git revision REV ("before") and from the working tree
# ("after"), built into bench/mix_kernel.c, and timed in interleaved rounds
# next to the read-only loop; prints per binary the median GB/s and every
# round, sorted. SHAPE is mix_kernel's arguments in quotes:
# "D T N THREADS REPEATS [HEADS]". Phase 2 variants (phase2_c_bf16_...) go
# into bench/phase2_kernel.c instead, next to its row-moving loop, with
# its arguments as SHAPE: "D T THREADS NORM"; one run takes one op.
#
#   bash bench/mix_ab.sh HEAD~3 "4096 1 9 1 2000 8" mix_c_bf16_fused_v16_g4_pt_dfma_ss_t1
#   bash bench/mix_ab.sh HEAD~1 "7168 16384 2 0" phase2_c_bf16_v16_u2_p1_ss_t2
#
# ROUNDS (default 9) sets the rounds, BUILD_DIR (default build/) the
# attnres whose `gen` writes the kernels. A shared host's neighbours shift
# every binary of a round alike; compare the medians of one run, not runs.
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 REV \"D T N THREADS REPEATS [HEADS]\" VARIANT..." >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
rev=$1 shape=$2
shift 2
build=$(cd "${BUILD_DIR:-$root/build}" && pwd)
rounds=${ROUNDS:-9}
case $rounds in '' | *[!0-9]* | 0) echo "$0: ROUNDS must be a positive integer" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc=${CC:-cc}

mkdir -p "$work/before"
git -C "$root" archive "$rev" templates | tar -x -C "$work/before"
harness=mix_kernel.c reference=read_only
case $1 in phase2_*) harness=phase2_kernel.c reference=move_rows ;; esac
for id in "$@"; do
  case $id in
    phase2_*) [ $harness = phase2_kernel.c ] ;;
    *) [ $harness = mix_kernel.c ] ;;
  esac || { echo "$0: $id: one run takes the variants of one op" >&2; exit 2; }
done
"$cc" -O3 -march=native -pthread "$root/bench/$harness" -o "$work/$reference"
bins=("$reference")
for id in "$@"; do
  for side in before after; do
    templates=$root/templates
    [ "$side" = before ] && templates=$work/before/templates
    ATTNRES_TEMPLATE_DIR=$templates "$build/bin/attnres" gen "$id" >"$work/$side-$id.c"
    "$cc" -O3 -march=native -pthread -DKERNEL_SOURCE="\"$work/$side-$id.c\"" -DKERNEL="attnres_$id" \
      "$root/bench/$harness" -o "$work/$side-$id" -lm
    bins+=("$side-$id")
  done
done

# shellcheck disable=SC2086 # the shape is a list of arguments
for _ in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    echo "$bin $(cd "$work" && "./$bin" $shape | awk '{print $(NF-1)}')"
  done
done | sort -k1,1 -k2n | awk '
  { v[$1] = v[$1] " " $2; c[$1]++ }
  END { for (b in v) { n = split(v[b], a, " "); printf "%-56s %6s GB/s  (%s )\n", b, a[int((n + 1) / 2)], v[b] } }' | sort
echo "(before: templates of $rev; after: the working tree; $rounds rounds of: ${harness%.c} $shape)"
