#!/usr/bin/env bash
# A template whose variants crash, hang, fail to compile, compute wrong
# results or run far too slowly: each is recorded with its status, and the
# run completes with a correct winner from the real templates.
set -euo pipefail
cli="$1"; src_templates="$2"; here="$(cd "$(dirname "$0")" && pwd)"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
cp -r "$src_templates" "$dir/templates"
cp "$here/templates/cpu/faulty.lua" "$dir/templates/cpu/faulty.lua"
export ATTNRES_TEMPLATE_DIR="$dir/templates" ATTNRES_CACHE_DIR="$dir/cache"
printf 'mix f32 128 3 1 replace 0 33\n' >"$dir/problems.txt"

"$cli" tune --device cpu --problems "$dir/problems.txt" --db "$dir/t.db" --time-limit 5 \
  >"$dir/out.txt" 2>"$dir/log.txt" || { cat "$dir/log.txt"; echo "0 passed, 1 failed"; exit 1; }

status() { sqlite3 "$dir/t.db" "select m.status from measurements m join candidates c on c.id = m.candidate_id where c.variant = '$1' order by m.id desc limit 1"; }
pass=0; fail=0
expect() {
  local got; got=$(status "$1")
  if [ "$got" = "$2" ]; then echo "ok   $1 recorded as $got"; pass=$((pass+1));
  else echo "FAIL $1 recorded as '$got', expected $2"; fail=$((fail+1)); fi
}
expect faulty_c_f32_crash launch_failed
expect faulty_c_f32_hang timeout
expect faulty_c_f32_nocompile compile_failed
expect faulty_c_f32_wrong wrong_result
expect faulty_c_f32_slow skipped
winner=$(sqlite3 "$dir/t.db" "select c.variant from winners w join candidates c on c.id = w.candidate_id")
if [[ "$winner" == mix_c_f32_* ]]; then echo "ok   winner $winner"; pass=$((pass+1));
else echo "FAIL winner '$winner'"; fail=$((fail+1)); fi
grep -q "crashed with signal" <(sqlite3 "$dir/t.db" "select message from measurements where status = 'launch_failed'") \
  && { echo "ok   the crash message names the signal"; pass=$((pass+1)); } \
  || { echo "FAIL no signal in the crash message"; fail=$((fail+1)); }
grep -q "stopped during a launch" <(sqlite3 "$dir/t.db" "select m.message from measurements m join candidates c on c.id = m.candidate_id where c.variant = 'faulty_c_f32_slow'") \
  && { echo "ok   the slow variant was cut during its launch"; pass=$((pass+1)); } \
  || { echo "FAIL the slow variant was not cut during its launch"; fail=$((fail+1)); }
grep -q "cut short during a launch" "$dir/out.txt" \
  && { echo "ok   the breakdown counts the cut"; pass=$((pass+1)); } \
  || { echo "FAIL the breakdown does not count the cut"; fail=$((fail+1)); }
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
