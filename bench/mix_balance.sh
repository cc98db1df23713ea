#!/usr/bin/env bash
# bench/mix_balance.sh "D N [HEADS]" VARIANT... - whether CPU mix kernels
# are held by memory or by the core: each variant from the working tree's
# templates timed three ways by bench/mix_ab.sh (REV "-"), next to the
# read-only loop over the same rows:
#   in cache    one thread, a few tokens whose rows fill about half the L2,
#               launched again and again (the core's own rate: arithmetic
#               and the second pass's L2 reads, no memory);
#   memory 1    one thread, T = 4096 (every row from memory);
#   memory all  T = 4096 on THREADS threads (default: every CPU).
# A kernel whose in-cache rate is not well above the read-only loop's rate
# from memory cannot stream at that rate from memory: its arithmetic alone
# takes as long as memory takes to deliver the rows (docs/cpu_kernels.md,
# "What bounds them on the AMD EPYC guest").
#
#   bash bench/mix_balance.sh "7168 9" mix_c_bf16_fused_v16_g4_pb_dfma_ss_t2
#   PARTIAL=1 bash bench/mix_balance.sh "1024 25" mix_c_f32_fused_v8_g4_b4_pb_dfma_ss_t2
#
# Variants of one dtype per run, as mix_ab.sh takes them; PARTIAL, NORM,
# READ_GROUP, ROUNDS (default 5) and BUILD_DIR pass through to it.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 \"D N [HEADS]\" VARIANT..." >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
read -r d n heads extra <<<"$1"
shift
heads=${heads:-1}
for v in "$d" "$n" "$heads"; do
  case $v in '' | *[!0-9]* | 0*) echo "$0: D, N and HEADS must be positive integers" >&2; exit 2 ;; esac
done
[ -z "${extra:-}" ] || { echo "$0: the shape is \"D N [HEADS]\"" >&2; exit 2; }
threads=${THREADS:-$(nproc)}
case $threads in '' | *[!0-9]* | 0*) echo "$0: THREADS must be a positive integer" >&2; exit 2 ;; esac
export ROUNDS=${ROUNDS:-5}

# The element size of the variants' dtype, and the rows one token moves:
# the N sources and the output, and the partial and normed rows if asked.
case $1 in mix_c_f32_*) esize=4 ;; *) esize=2 ;; esac
rows=$((n + 1))
[ "${PARTIAL:-}" = 1 ] && rows=$((rows + 1))
[ "${NORM:-}" = 1 ] && rows=$((rows + 1))

# The L2 of CPU 0 in bytes (1 MiB where sysfs does not say).
l2=$(cat /sys/devices/system/cpu/cpu0/cache/index2/size 2>/dev/null || echo 1024K)
case $l2 in
  *K) l2=$((${l2%K} * 1024)) ;;
  *M) l2=$((${l2%M} * 1024 * 1024)) ;;
  *[!0-9]*) l2=$((1024 * 1024)) ;;
esac
token_bytes=$((rows * d * esize))
tc=$((l2 / 2 / token_bytes))
[ "$tc" -ge 1 ] || tc=1
# About as many tokens in all as the memory runs move.
repeats=$(((4096 + tc - 1) / tc))

# The median GB/s of each binary in one mix_ab.sh run (a failed run stops
# the script), as "name value" lines in file $2.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
medians() {
  bash "$root/bench/mix_ab.sh" - "$1" "${variants[@]}" >"$work/run.txt"
  awk '/ GB\/s /{sub(/^after-/, "", $1); print $1, $2}' "$work/run.txt" >"$2"
}
variants=("$@")
declare -A cache mem1 memall
medians "$d $tc $n 1 $repeats $heads" "$work/cache.txt"
medians "$d 4096 $n 1 1 $heads" "$work/mem1.txt"
medians "$d 4096 $n $threads 1 $heads" "$work/memall.txt"
while read -r b v; do cache[$b]=$v; done <"$work/cache.txt"
while read -r b v; do mem1[$b]=$v; done <"$work/mem1.txt"
while read -r b v; do memall[$b]=$v; done <"$work/memall.txt"

echo "d=$d N=$n H=$heads, $esize-byte elements, $rows rows a token; in cache: T=$tc x $repeats launches;"
echo "GB/s of the rows moved, medians of $ROUNDS rounds; in (): of the read-only loop from memory;"
echo "cache/read 1: the in-cache rate over the read-only loop's from memory on one thread"
printf '%-48s %9s %14s %14s %13s\n' binary "in cache" "memory 1 thr" "memory $threads thr" "cache/read 1"
for b in read_only "${variants[@]}"; do
  awk -v b="$b" -v c="${cache[$b]:-nan}" -v m1="${mem1[$b]:-nan}" -v ma="${memall[$b]:-nan}" \
      -v r1="${mem1[read_only]:-nan}" -v ra="${memall[read_only]:-nan}" 'BEGIN {
    printf "%-48s %9.1f %7.1f (%3.0f%%) %7.1f (%3.0f%%) %13.2f\n", b, c, m1, 100 * m1 / r1, ma, 100 * ma / ra, c / r1
  }'
done
