#!/usr/bin/env bash
# `attnres tune` killed with SIGKILL while its forked measuring child runs a
# kernel that never returns: the child must die with the tuner. An orphan
# would spin on a core until someone notices, on a shared box for hours.
#
# The only candidate is faulty.lua's "hang" variant (made from the shipped
# cpu/mix template by faulty.lua itself), so the measuring child is the one
# forked child of the tuner that is named attnres and not the compiler.
#
# usage: test_tune_orphans.sh ATTNRES_CLI TEMPLATE_DIR
set -euo pipefail
cli="$1"; src_templates="$2"; here="$(cd "$(dirname "$0")" && pwd)"
. "$here/../lib/killed_tuners.sh"
# A template directory with one template: faulty.lua cut down to its f32
# hang variant, its base template moved under lib/ so that the tuner does
# not tune the real variants too.
mkdir -p "$dir/templates/cpu"
cp -r "$src_templates/lib" "$dir/templates/lib"
cp "$src_templates/cpu/mix.lua" "$dir/templates/lib/orphan_test_mix.lua"
sed -e 's|require("cpu/mix")|require("lib/orphan_test_mix")|' \
    -e 's|values = { "f32", "bf16", "f16" }|values = { "f32" }|' \
    -e 's|values = { "crash", "wrong", "hang", "nocompile", "slow" }|values = { "hang" }|' \
    "$here/templates/cpu/faulty.lua" >"$dir/templates/cpu/faulty.lua"
export ATTNRES_TEMPLATE_DIR="$dir/templates" ATTNRES_CACHE_DIR="$dir/cache"
if [ "$("$cli" gen --list)" != faulty_c_f32_hang ]; then
  echo "FAIL the cut-down template does not list exactly faulty_c_f32_hang"; echo "0 passed, 1 failed"; exit 1
fi
printf 'mix f32 128 3 1 replace 0 33\n' >"$dir/problems.txt"

pass=0; fail=0
for round in 1 2 3; do
  # The time limit is far beyond the test: only the kill can end the child.
  "$cli" tune --device cpu --problems "$dir/problems.txt" --db "$dir/t.db" --time-limit 600 --quiet \
    >/dev/null 2>&1 &
  tuner=$!
  child=""
  for _ in $(seq 1 300); do
    for c in $(pgrep -P "$tuner" 2>/dev/null || true); do
      [ "$(cat "/proc/$c/comm" 2>/dev/null)" = attnres ] && child=$c
    done
    [ -n "$child" ] && break
    sleep 0.1
  done
  if [ -z "$child" ]; then
    echo "FAIL round $round: no measuring child appeared within 30 s"; fail=$((fail+1))
    kill -9 "$tuner" 2>/dev/null || true; wait "$tuner" 2>/dev/null || true; tuner=""
    continue
  fi
  # Let the child get into the kernel's loop, then kill the tuner alone.
  sleep "0.$((RANDOM % 5 + 3))"
  kill -9 "$tuner"
  wait "$tuner" 2>/dev/null || true
  tuner=""
  gone=0
  for _ in $(seq 1 20); do
    if ! kill -0 "$child" 2>/dev/null || [ "$(awk '{print $3}' "/proc/$child/stat" 2>/dev/null)" = Z ]; then
      gone=1; break
    fi
    sleep 0.1
  done
  if [ "$gone" = 1 ]; then
    echo "ok   round $round: measuring child $child died with the tuner"; pass=$((pass+1))
  else
    survivors+=("$child")
    echo "FAIL round $round: measuring child $child still runs 2 s after the tuner was killed"
    fail=$((fail+1))
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
