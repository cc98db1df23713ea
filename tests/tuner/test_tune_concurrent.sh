#!/usr/bin/env bash
# Four tuner processes on one database at once: none fails, every
# candidate of every problem has a measurement, and the file is intact.
set -euo pipefail
cli="$1"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# The suite's kernel cache where ctest names one: compiling is not under
# test here, and the suite compiles each variant once.
export ATTNRES_CACHE_DIR="${ATTNRES_TEST_KERNEL_CACHE:-$dir/cache}"
db="$dir/t.db"
pids=()
for i in 0 1 2 3; do
  "$cli" tune --device cpu --preset ci --db "$db" >"$dir/out$i.txt" 2>"$dir/log$i.txt" &
  pids+=($!)
done
pass=0; fail=0
for i in 0 1 2 3; do
  if wait "${pids[$i]}"; then pass=$((pass+1)); else echo "FAIL process $i:"; cat "$dir/log$i.txt"; fail=$((fail+1)); fi
done
echo "processes that succeeded: $pass of 4"
check=$(sqlite3 "$db" "pragma integrity_check")
[ "$check" = ok ] && { echo "ok   integrity_check"; pass=$((pass+1)); } || { echo "FAIL integrity: $check"; fail=$((fail+1)); }
# Every candidate of every problem has a measurement: the tuner logs how
# many candidates each problem had.
expected=$(grep -o '[0-9]* candidate(s)' "$dir/log0.txt" | awk 'NR == 1 || $1 < m { m = $1 } END { print m + 0 }')
runs=$(sqlite3 "$db" "select count(*) from runs where status = 'complete'")
[ "$runs" = 4 ] && { echo "ok   4 complete runs recorded"; pass=$((pass+1)); } || { echo "FAIL $runs complete runs"; fail=$((fail+1)); }
winners=$(sqlite3 "$db" "select count(*) from winners")
total=$(grep -o '^\[1/[0-9]*\]' "$dir/log0.txt" | head -1 | tr -dc '0-9/' | cut -d/ -f2)
[ -n "$total" ] && [ "$winners" = $((total * 4)) ] && { echo "ok   $winners winners ($total problems x 4 runs)"; pass=$((pass+1)); } \
  || { echo "FAIL $winners winners for ${total:-?} problems x 4 runs"; fail=$((fail+1)); }
per_problem=$(sqlite3 "$db" "select min(c) from (select count(distinct candidate_id) c from measurements group by problem_id)")
if [ "$expected" -gt 0 ] && [ "${per_problem:-0}" -ge "$expected" ]; then
  echo "ok   every problem has all of its $expected candidates measured"; pass=$((pass+1))
else
  echo "FAIL a problem has ${per_problem:-0} of $expected candidates measured"; fail=$((fail+1))
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
