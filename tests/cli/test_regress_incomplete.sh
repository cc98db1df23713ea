#!/usr/bin/env bash
# Killed runs and `attnres db regress`: a tuning run killed with
# SIGKILL stays 'running' only until the next attnres opens the database for
# writing, which marks it 'interrupted'; regress refuses a baseline or a
# candidate that did not complete (running, interrupted, failed) with exit 2
# and a message that says why, and still compares complete runs.
#
# usage: test_regress_incomplete.sh ATTNRES_CLI
set -uo pipefail
cli="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# The suite's kernel cache where ctest names one: compiling is not under
# test here, and the suite compiles each variant once.
export ATTNRES_CACHE_DIR="${ATTNRES_TEST_KERNEL_CACHE:-$dir/cache}"
. "$(dirname "$0")/../lib/checks.sh"
status() { sqlite3 "$1" "select status from runs where id = $2"; }

echo "-- a tuning run killed with SIGKILL"
db="$dir/killed.db"
"$cli" tune --device cpu --preset ci --db "$db" --quiet >/dev/null 2>&1 &
pid=$!
# Killed as soon as its run is recorded (it then compiles and measures for
# many seconds), so the kill always lands inside the run.
for _ in $(seq 1 600); do
  [ "$(sqlite3 "$db" "select count(*) from runs" 2>/dev/null)" = 1 ] && break
  sleep 0.1
done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
[ "$(status "$db" 1)" = running ] && ok "the killed run is left 'running'" || bad "killed run: $(status "$db" 1)"
"$cli" db runs --db "$db" >/dev/null 2>&1
[ "$(status "$db" 1)" = running ] && ok "a read-only command decides nothing" || bad "after db runs: $(status "$db" 1)"
expect_rc 0 "the next writer opens the database" -- "$cli" db note 1 "killed" --db "$db"
[ "$(status "$db" 1)" = interrupted ] && ok "the killed run is now 'interrupted'" || bad "after a writer: $(status "$db" 1)"

echo "-- regress and incomplete runs"
db="$dir/runs.db"
python3 - "$dir/in.json" <<'PY'
import json, sys
key = "mix:f32:d16:n2:h1:replace:epi0:s0:t8"
runs, ms, ws = [], [], []
for i, st in enumerate(["complete", "complete", "running", "interrupted", "failed"], 1):
    runs.append({"uid": "run-%d" % i, "started_at": "2025-01-0%dT00:00:00.000Z" % i, "status": st,
                 "device": "fp", "copy_gbps": 20.0})
    ms.append({"id": i, "run": "run-%d" % i, "problem": key, "variant": "v", "source_hash": "h", "device": "fp",
               "status": "ok", "median_us": 10.0 if i < 3 else 50.0, "spread_us": 0.1, "created_at": "t"})
    ws.append({"run": "run-%d" % i, "problem": key, "device": "fp", "variant": "v", "source_hash": "h",
               "measurement": i})
doc = {"format": "attnres-export", "version": 1,
       "devices": [{"fingerprint": "fp", "backend": "cpu"}],
       "problems": [{"key": key, "op": "mix", "dtype": "f32", "form": "replace", "d": 16, "n": 2, "heads": 1,
                     "epilogue": 0, "s": 0, "t_bucket": 8}],
       "candidates": [{"variant": "v", "source_hash": "h"}], "runs": runs, "measurements": ms, "winners": ws}
json.dump(doc, open(sys.argv[1], "w"))
PY
expect_rc 0 "five runs import" -- "$cli" db import "$dir/in.json" --db "$db"
expect_rc 0 "two complete runs compare" -- "$cli" db regress --db "$db" --baseline 1 --candidate 2
for c in "3 running is still running" "4 interrupted was interrupted" "5 failed failed before"; do
  read -r id st why <<<"$c"
  expect_rc 2 "a $st baseline is refused" -- "$cli" db regress --db "$db" --baseline "$id" --candidate 1
  grep -q "the baseline run $id ($st) $why" "$dir/err.txt" && ok "with a message that says why" ||
    bad "message for a $st baseline: $(cat "$dir/err.txt")"
  expect_rc 2 "a $st candidate is refused" -- "$cli" db regress --db "$db" --baseline 1 --candidate "$id"
  grep -q "the candidate run $id ($st)" "$dir/err.txt" && ok "naming the candidate" ||
    bad "message for a $st candidate: $(cat "$dir/err.txt")"
done
expect_rc 2 "the default candidate (newest after the baseline) is refused when incomplete" -- \
  "$cli" db regress --db "$db" --baseline 2
expect_rc 2 "--json is refused the same way" -- "$cli" db regress --db "$db" --baseline 4 --candidate 1 --json
[ ! -s "$dir/out.txt" ] && ok "and prints no half report" || bad "output: $(cat "$dir/out.txt")"

finish
