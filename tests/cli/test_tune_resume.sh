#!/usr/bin/env bash
# `attnres tune` twice on one database: every candidate of the first run
# verifies, and the second run must compile and measure nothing, reuse every
# measurement, and name the same winners.
set -euo pipefail
cli="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The suite's kernel cache where ctest names one: compiling is not under
# test here, and the suite compiles each variant once.
export ATTNRES_CACHE_DIR="${ATTNRES_TEST_KERNEL_CACHE:-$dir/cache}"

"$cli" tune --device cpu --preset ci --db "$dir/t.db" >"$dir/first.txt" 2>"$dir/first.log"
"$cli" tune --device cpu --preset ci --db "$dir/t.db" >"$dir/second.txt" 2>"$dir/second.log"

fail=0
summary=$(grep '^run ' "$dir/second.txt")
echo "first:  $(grep '^run ' "$dir/first.txt")"
echo "second: $summary"
if ! grep -Eq ': 0 measured, [1-9][0-9]* reused' <<<"$summary"; then
  echo "FAIL: the second run measured something again"; fail=1
fi
if grep -q 'compiled' "$dir/second.log"; then
  echo "FAIL: the second run compiled something"; fail=1
fi
# Winners table rows (problem + variant) must be identical.
winners() { sed -n '/^problem/,/^$/p' "$1" | awk '{print $1,$2,$3,$4,$5,$6,$7,$8}'; }
if ! diff <(winners "$dir/first.txt") <(winners "$dir/second.txt") >/dev/null; then
  echo "FAIL: winners differ between the runs"; fail=1
fi
# Every candidate of every CPU template verified against the fp64 reference:
# a template change that breaks a variant shows up here as "not ok".
if ! grep -Eq ', 0 not ok,' <<<"$(grep '^run ' "$dir/first.txt")"; then
  echo "FAIL: some candidates did not verify:"
  sqlite3 "$dir/t.db" "select c.variant, m.status, m.message from measurements m
                        join candidates c on c.id = m.candidate_id where m.status <> 'ok'" | head -20
  fail=1
fi
for template in cpu/mix cpu/mix_fused cpu/phase1 cpu/phase2; do
  ok=$(sqlite3 "$dir/t.db" "select count(*) from measurements m join candidates c on c.id = m.candidate_id
                            where c.template_name = '$template' and m.status = 'ok'")
  echo "$template: $ok candidates verified and timed"
  if [ "$ok" = 0 ]; then echo "FAIL: no candidate of $template was measured"; fail=1; fi
done
# Both runs measured and recorded the CPU's read-only bandwidth, and the
# table gives each winner's share of it (the columns % ceiling, % paired,
# which is "-" for the ci preset's problems, all in cache, % copy, % read
# and % FMA).
read_runs=$(sqlite3 "$dir/t.db" "select count(*) from runs where read_gbps > 0")
echo "runs with a read ceiling: $read_runs"
if [ "$read_runs" != 2 ]; then echo "FAIL: a run recorded no read bandwidth"; fail=1; fi
if ! grep -Eq '^copy bandwidth [0-9.]+ GB/s, read [0-9.]+ GB/s' "$dir/first.txt" ||
   [ "$(sed -n '/^problem/,/^$/p' "$dir/first.txt" | grep -Ec '[0-9]% +(-|[0-9.]+%) +[0-9.]+% +[0-9.]+% +(-|[0-9.]+%)$')" -lt 2 ]; then
  echo "FAIL: the winners table lacks the read ceiling"; fail=1
fi
rows=$(sqlite3 "$dir/t.db" "select count(*) from winners" 2>/dev/null || echo "?")
echo "winner rows: $rows"
[ "$fail" = 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
