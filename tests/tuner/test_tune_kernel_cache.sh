#!/usr/bin/env bash
# The kernel cache spares compiles across databases: a run on a new
# database takes every variant an earlier run compiled from the cache,
# compiles again the one whose cached binary was damaged (its seal does not
# match), and records where its time went, with the run.
set -euo pipefail
cli="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "$0")/../lib/checks.sh"
# A private cache: what it holds is under test here.
export ATTNRES_CACHE_DIR="$dir/cache"
printf 'phase2 f32 256 1 1 replace 1 64 fuse=1\n' >"$dir/p.txt"
tune() { "$cli" tune --device cpu --problems "$dir/p.txt" --shard 0/6 --db "$1" >"$dir/$2.txt" 2>"$dir/$2.log"; }

tune "$dir/a.db" first
compiled=$(sed -n 's/^compiled \([0-9]*\) variant.*/\1/p' "$dir/first.log")
if [ -n "$compiled" ] && [ "$compiled" -gt 1 ]; then ok "the first run compiled $compiled variants"; else
  bad "the first run compiled '${compiled}' variants"; cat "$dir/first.log"; fi

# Damage one cached binary: one byte in the middle.
victim=$(ls "$dir/cache" | grep -v '\.' | head -1)
size=$(stat -c %s "$dir/cache/$victim")
printf 'X' | dd of="$dir/cache/$victim" bs=1 seek=$((size / 2)) conv=notrunc status=none

tune "$dir/b.db" second
found=$(sed -n 's/^\([0-9]*\) variant(s) found in the kernel cache.*/\1/p' "$dir/second.log")
again=$(sed -n 's/^compiled \([0-9]*\) variant.*/\1/p' "$dir/second.log")
if [ "$found" = $((compiled - 1)) ] && [ "$again" = 1 ]; then
  ok "a new database took $found variants from the cache and compiled the damaged one again"
else
  bad "from the cache: '$found', compiled: '$again' (want $((compiled - 1)) and 1)"; cat "$dir/second.log"
fi
if grep -Eq ', 0 not ok,' "$dir/second.txt"; then ok "every candidate verified"; else
  bad "some candidates did not verify: $(grep '^run ' "$dir/second.txt")"; fi

# The breakdown: printed after the winners and recorded with the run.
if grep -q '^where the time went' "$dir/second.txt" && grep -Eq '^  compile +[0-9.]+ s' "$dir/second.txt"; then
  ok "the run printed where its time went"
else
  bad "no breakdown in the output"; cat "$dir/second.txt"
fi
stages=$("$cli" db runs --long --db "$dir/b.db" | sed -n 's/^  stages *//p')
if grep -q '"compile": {"s": [0-9.]*, "n": 1}' <<<"$stages" && grep -q '"total_s"' <<<"$stages"; then
  ok "the run recorded its stages: compile n = 1"
else
  bad "recorded stages: '$stages'"
fi
finish
