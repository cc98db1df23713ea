#!/usr/bin/env bash
# bench/run.sh [BUILD_DIR] - the runtime benchmarks, from scratch:
#   1. tunes, on the CPU, a database for the problems of the K3-shaped
#      example (examples/k3_model.h at d = $BENCH_D, fp32): the mix form's
#      N = 1..9 and the two-phase form's phase1 (n = 1..8, S = 24 or 18) and
#      phase2 (with and without the fused add), T buckets 1 and 64;
#   2. warms the binary cache (one model load), then runs plan_load for both
#      forms: the time to plan all 186 sites from the warm database;
#   3. runs run_overhead: attnres_run_mix / attnres_run_phase2 against a
#      direct call of the same kernel at T = 1.
# Environment: BENCH_D (256), BENCH_DIR (BUILD_DIR/bench-data), TUNE_ARGS
# (--strategy random --budget 4: a quick tune; the timings of planning do not
# depend on which variant won), ATTNRES_CACHE_DIR (BENCH_DIR/cache).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
dir=${BENCH_DIR:-$build/bench-data}
d=${BENCH_D:-256}
read -r -a tune_args <<<"${TUNE_ARGS:---strategy random --budget 4}"
export ATTNRES_CACHE_DIR=${ATTNRES_CACHE_DIR:-$dir/cache}
export ATTNRES_TEMPLATE_DIR=$root/templates
mkdir -p "$dir"
db=$dir/k3-d$d.db
for tool in attnres plan_load run_overhead k3_engine; do
  [ -x "$build/bin/$tool" ] || { echo "bench/run.sh: $build/bin/$tool is missing; build first" >&2; exit 1; }
done

if [ ! -f "$db" ]; then
  problems=$dir/k3-d$d.problems
  {
    echo "# The problems of examples/k3_engine at d = $d (fp32), T buckets 1 and 64."
    for n in 1 2 3 4 5 6 7 8 9; do echo "mix    f32 $d $n 1 replace 0 1,64"; done
    for n in 1 2 3 4 5 6 7; do echo "phase1 f32 $d $n 1 replace 0 1,64 s=24"; done
    echo "phase1 f32 $d 8 1 replace 0 1,64 s=18"
    echo "phase2 f32 $d 1 1 replace 0 1,64 fuse=0"
    echo "phase2 f32 $d 1 1 replace 0 1,64 fuse=1"
  } >"$problems"
  echo "== tuning $db (${tune_args[*]})"
  "$build/bin/attnres" tune --device cpu --problems "$problems" --db "$db" "${tune_args[@]}" --quiet
fi

echo "== warming the binary cache and checking the example with this database"
for form in phase mix; do
  "$build/bin/k3_engine" --db "$db" --form "$form" --d "$d" --tokens 1 | sed -n '/model load\|PASS\|FAIL/p'
done

echo
echo "== host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
for form in phase mix; do
  echo
  "$build/bin/plan_load" --db "$db" --form "$form" --d "$d" --loads 21
done
echo
"$build/bin/run_overhead" --db "$db" --d "$d" --n 9
echo
"$build/bin/run_overhead" --d 16 --n 2 --calls 20 --rounds 2001   # a tiny kernel: the overhead itself
echo
"$build/bin/run_overhead" --d 7168 --n 9 --calls 5 --rounds 201
