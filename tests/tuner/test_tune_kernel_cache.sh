#!/usr/bin/env bash
# What spares a tune its compiles. The kernel cache: a run on a new
# database takes every variant an earlier run compiled from the cache,
# compiles again the one whose cached binary was damaged (its seal does not
# match), and records where its time went, with the run. Pruning: the
# variants a template prunes are listed with their reasons and tuned with
# --no-prune. The precompiled header of the kernels' system headers: made
# once in the cache, and a damaged one costs no compile its result. The
# ceilings: taken from a recent run of this device in another database
# (--ceilings-from), measured where that file holds none recent enough.
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
# Pruning, on a mix with short head slices in cache: bursts and the
# prefetches from the mix are pruned, said why, and tuned with --no-prune.
printf 'mix f32 256 5 1 replace 0 64\n' >"$dir/mix.txt"
"$cli" tune --device cpu --problems "$dir/mix.txt" --shard 0/8 --db "$dir/c.db" --explain-pruning \
  >"$dir/pruned.txt" 2>"$dir/pruned.log"
"$cli" tune --device cpu --problems "$dir/mix.txt" --shard 0/8 --db "$dir/d.db" --no-prune \
  >"$dir/unpruned.txt" 2>"$dir/unpruned.log"
npruned=$(grep -c '^  pruned .*: bursts of 4 are tuned for head slices' "$dir/pruned.log" || true)
kept=$(sed -n 's/^\[1\/1\] [^:]*: \([0-9]*\) candidate.*/\1/p' "$dir/pruned.log")
all=$(sed -n 's/^\[1\/1\] [^:]*: \([0-9]*\) candidate.*/\1/p' "$dir/unpruned.log")
listed=$(grep -c '^  pruned ' "$dir/pruned.log" || true)
if [ "$npruned" -gt 0 ] && [ -n "$kept" ] && [ -n "$all" ] && [ $((kept + listed)) = "$all" ] &&
   grep -q "candidate(s) pruned before compiling" "$dir/pruned.txt"; then
  ok "$listed pruned with reasons ($npruned for bursts), $kept tuned; --no-prune tuned all $all"
else
  bad "pruned: listed '$listed', bursts '$npruned', tuned '$kept', with --no-prune '$all'"
fi

# The precompiled header the compiles above shared.
gch=$(ls "$dir/cache" | grep '^pch-.*\.h\.gch$' | head -1 || true)
if [ -n "$gch" ] && [ -f "$dir/cache/${gch%.gch}" ]; then ok "the compiles shared a precompiled header ($gch)"; else
  bad "no precompiled header in the cache: $(ls "$dir/cache" | grep '^pch-' || true)"; fi
# Damaged (zeros over its middle), it still leaves every compile right:
# the compiler ignores it or fails and the compile is retried without it.
if [ -n "$gch" ]; then
  size=$(stat -c %s "$dir/cache/$gch")
  dd if=/dev/zero of="$dir/cache/$gch" bs=4096 seek=$((size / 8192)) count=64 conv=notrunc status=none
  find "$dir/cache" -maxdepth 1 -type f ! -name '*.*' -delete
  tune "$dir/e.db" damaged_pch
  again=$(sed -n 's/^compiled \([0-9]*\) variant.*/\1/p' "$dir/damaged_pch.log")
  if [ "$again" = "$compiled" ] && grep -Eq ', 0 not ok,' "$dir/damaged_pch.txt"; then
    ok "with a damaged precompiled header all $again variants compiled again and verified"
  else
    bad "with a damaged precompiled header: compiled '$again' of $compiled; $(grep '^run ' "$dir/damaged_pch.txt")"
    cat "$dir/damaged_pch.log"
  fi
fi

# The ceilings, from the suite's tuned database, which measured them on
# this machine: the run says so and records the run it took them from.
ci_db="${ATTNRES_TEST_CI_DB:?needs the tuned database of the suite}"
ci_uid=$(sqlite3 "$ci_db" "select uid from runs where ceilings is not null and ceilings not like '%carried_from_%'
                           order by id desc limit 1")
"$cli" tune --device cpu --problems "$dir/p.txt" --shard 0/6 --db "$dir/f.db" --ceilings-from "$ci_db" \
  >"$dir/taken.txt" 2>"$dir/taken.log"
recorded=$(sqlite3 "$dir/f.db" "select ceilings from runs")
if [ -n "$ci_uid" ] && grep -q "^the ceilings are those run $ci_uid of " "$dir/taken.log" &&
   grep -q "\"carried_from_uid\": \"$ci_uid\"" <<<"$recorded" &&
   grep -q "^(ceilings as run $ci_uid of .* measured them)" "$dir/taken.txt"; then
  ok "the ceilings were taken from run $ci_uid of the tuned database and recorded so"
else
  bad "ceilings from '$ci_uid': $(grep -i ceilings "$dir/taken.log" || true); recorded '$recorded'"
fi
# Two days old, that run is too old to stand for the machine now.
sqlite3 "$ci_db" ".backup '$dir/old.db'"
sqlite3 "$dir/old.db" "update runs set started_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 days')"
"$cli" tune --device cpu --problems "$dir/p.txt" --shard 0/6 --db "$dir/g.db" --ceilings-from "$dir/old.db" \
  >"$dir/old.txt" 2>"$dir/old.log"
recorded=$(sqlite3 "$dir/g.db" "select ceilings from runs")
if grep -q "^no ceilings from $dir/old.db (no run in the last 86400 s measured this device's ceilings): measuring them" \
     "$dir/old.log" && grep -q '"copy_gbps"' <<<"$recorded" && ! grep -q carried_from <<<"$recorded"; then
  ok "with only a run of two days ago in the file the run measured the ceilings itself"
else
  bad "ceilings from a stale file: $(grep -i ceilings "$dir/old.log" || true); recorded '$recorded'"
fi
finish
