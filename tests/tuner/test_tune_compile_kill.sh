#!/usr/bin/env bash
# `attnres tune` killed with SIGKILL again and again while it compiles:
#   - every kill keeps the binaries built before it (each is stored as soon
#     as it is built), so the stored count grows from kill to kill;
#   - the C compiler's directories are made under $TMPDIR;
#   - a killed process's directory is removed by the next process that
#     opens the CPU device, and none is left at the end.
#
# usage: test_tune_compile_kill.sh ATTNRES_CLI
set -euo pipefail
cli="$1"
. "$(dirname "$0")/../lib/killed_tuners.sh"
export ATTNRES_CACHE_DIR="$dir/cache" TMPDIR="$dir/tmp"
mkdir -p "$TMPDIR"
# One problem with many variants: compiling them takes far longer than the
# test waits, one job at a time.
printf 'mix f32 256 4 1 replace 0 64\n' >"$dir/problems.txt"
db="$dir/t.db"
pass=0; fail=0
seen_tmp=0
stored=0
for round in 1 2 3; do
  "$cli" tune --device cpu --problems "$dir/problems.txt" --db "$db" --jobs 1 --quiet >/dev/null 2>&1 &
  tuner=$!
  # Kill once the tuner has started its 6th compiler process.
  declare -A compilers=()
  for _ in $(seq 1 1200); do
    for c in $(pgrep -P "$tuner" 2>/dev/null || true); do
      [ "$(cat "/proc/$c/comm" 2>/dev/null)" != attnres ] && compilers[$c]=1
    done
    compgen -G "$TMPDIR/attnres-cc-*" >/dev/null && seen_tmp=1
    [ "${#compilers[@]}" -ge 6 ] && break
    sleep 0.05
  done
  kill -9 "$tuner" 2>/dev/null || true
  wait "$tuner" 2>/dev/null || true
  tuner=""
  n=$(sqlite3 "$db" "select count(*) from binaries" 2>/dev/null || echo 0)
  if [ "${#compilers[@]}" -ge 6 ] && [ "$n" -gt "$stored" ]; then
    echo "ok   kill $round after ${#compilers[@]} compiler runs: $n binaries stored (was $stored)"; pass=$((pass+1))
  else
    echo "FAIL kill $round after ${#compilers[@]} compiler runs: $n binaries stored (was $stored)"; fail=$((fail+1))
  fi
  stored=$n
  unset compilers
done
if [ "$seen_tmp" = 1 ]; then echo "ok   the compiler's directories are made under TMPDIR"; pass=$((pass+1));
else echo "FAIL no attnres-cc-* directory ever appeared under TMPDIR ($TMPDIR)"; fail=$((fail+1)); fi
# The next process to open the CPU device removes what the killed ones left
# (their compilers, orphaned by the kill, may still be finishing: wait for
# the last of them first, so that none recreates a file after the sweep).
sleep 1
before=$(compgen -G "$TMPDIR/attnres-cc-*" | wc -l || true)
echo "     $before compiler directory(ies) left by the last kill before \`attnres devices\`"
"$cli" devices >/dev/null 2>&1 || true
left=$(compgen -G "$TMPDIR/attnres-cc-*" || true)
if [ -z "$left" ]; then echo "ok   no compiler directory left after the kills"; pass=$((pass+1));
else echo "FAIL compiler directories left: $left"; fail=$((fail+1)); fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
