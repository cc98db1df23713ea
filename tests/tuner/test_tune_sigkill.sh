#!/usr/bin/env bash
# `attnres tune` killed with SIGKILL at random moments, many times: after
# each kill the database passes PRAGMA integrity_check, and a final run
# completes the work without measuring any candidate's screening twice.
set -euo pipefail
cli="$1"; kills="${2:-8}"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
export ATTNRES_CACHE_DIR="$dir/cache"
db="$dir/t.db"
pass=0; fail=0
for i in $(seq 1 "$kills"); do
  "$cli" tune --device cpu --preset ci --db "$db" --quiet >/dev/null 2>&1 &
  pid=$!
  # A random moment between 0.2 and 15 seconds into the run (a whole ci run
  # takes about 15 s here): during setup, compilation or measurement.
  sleep "$(awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.2 + 14.8 * rand() }')"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [ -f "$db" ]; then
    check=$(sqlite3 "$db" "pragma integrity_check" 2>&1)
    if [ "$check" = "ok" ]; then pass=$((pass+1)); else echo "FAIL after kill $i: $check"; fail=$((fail+1)); fi
  fi
done
echo "killed $kills run(s); integrity_check ok after $pass"
before=$(sqlite3 "$db" "select count(distinct candidate_id || '/' || problem_id) from measurements" 2>/dev/null || echo 0)
"$cli" tune --device cpu --preset ci --db "$db" >"$dir/final.txt" 2>&1 \
  && { echo "ok   the run after the kills completed: $(grep '^run ' "$dir/final.txt")"; pass=$((pass+1)); } \
  || { echo "FAIL the run after the kills failed"; cat "$dir/final.txt"; fail=$((fail+1)); }
reused=$(sed -n 's/.* \([0-9]*\) reused.*/\1/p' "$dir/final.txt" | tail -1)
echo "measured before the final run: $before candidate/problem pairs; the final run reused ${reused:-0}"
if [ "${reused:-0}" -ge "$before" ]; then echo "ok   the final run reused everything measured before"; pass=$((pass+1));
else echo "FAIL the final run reused ${reused:-0} of $before"; fail=$((fail+1)); fi
dups=$(sqlite3 "$db" "select count(*) from (select candidate_id, problem_id from measurements
                       where message like 'screening%' group by candidate_id, problem_id having count(*) > 1)")
if [ "$dups" = 0 ]; then echo "ok   no candidate was screened twice"; pass=$((pass+1));
else echo "FAIL $dups candidate(s) screened twice"; fail=$((fail+1)); fi
problems=$(sqlite3 "$db" "select count(distinct problem_id) from winners w join runs r on r.id = w.run_id where r.status = 'complete'")
total=$(grep -o '^\[1/[0-9]*\]' "$dir/final.txt" | head -1 | tr -dc '0-9/' | cut -d/ -f2)
if [ -n "$total" ] && [ "$problems" = "$total" ]; then echo "ok   every one of the $total ci problems has a winner"; pass=$((pass+1));
else echo "FAIL winners for $problems of ${total:-?} problems"; fail=$((fail+1)); fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
