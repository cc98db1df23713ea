#!/usr/bin/env bash
# Two shards of one tuning job on separate databases, merged: together they
# measured every candidate once, and a run on the merged file measures
# nothing again and names a winner for every problem.
set -euo pipefail
cli="$1"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
# The suite's kernel cache where ctest names one: compiling is not under
# test here, and the suite compiles each variant once.
export ATTNRES_CACHE_DIR="${ATTNRES_TEST_KERNEL_CACHE:-$dir/cache}"
printf 'mix f32 128 4 1 replace 0 1,40\n' >"$dir/p.txt"
pass=0; fail=0
"$cli" tune --device cpu --problems "$dir/p.txt" --shard 0/2 --db "$dir/a.db" --quiet >"$dir/a.txt"
"$cli" tune --device cpu --problems "$dir/p.txt" --shard 1/2 --db "$dir/b.db" --quiet >"$dir/b.txt"
"$cli" tune --device cpu --problems "$dir/p.txt" --db "$dir/all.db" --quiet >"$dir/all.txt"
count() { sqlite3 "$1" "select count(distinct c.variant) from measurements m join candidates c on c.id = m.candidate_id"; }
a=$(count "$dir/a.db"); b=$(count "$dir/b.db"); all=$(count "$dir/all.db")
overlap=$(sqlite3 "$dir/a.db" "attach '$dir/b.db' as b; select count(*) from (select variant from candidates c join measurements m on m.candidate_id = c.id intersect select variant from b.candidates c join b.measurements m on m.candidate_id = c.id)")
if [ "$a" -gt 0 ] && [ "$b" -gt 0 ] && [ $((a + b)) = "$all" ] && [ "$overlap" = 0 ]; then
  echo "ok   shards measured $a + $b disjoint candidates of $all"; pass=$((pass+1))
else
  echo "FAIL shards measured $a + $b (overlap $overlap) of $all"; fail=$((fail+1))
fi
"$cli" db merge "$dir/b.db" --db "$dir/a.db" >/dev/null
"$cli" tune --device cpu --problems "$dir/p.txt" --db "$dir/a.db" >"$dir/final.txt" 2>&1
summary=$(grep '^run ' "$dir/final.txt")
if grep -Eq ': 0 measured, [1-9][0-9]* reused' <<<"$summary"; then echo "ok   after the merge: $summary"; pass=$((pass+1));
else echo "FAIL after the merge: $summary"; fail=$((fail+1)); fi
if ! grep -q 'none verified' "$dir/final.txt" && [ "$(grep -c '^mix f32' "$dir/final.txt")" = 2 ]; then
  echo "ok   both problems have a winner after the merge"; pass=$((pass+1))
else
  echo "FAIL missing winners after the merge"; cat "$dir/final.txt"; fail=$((fail+1))
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
