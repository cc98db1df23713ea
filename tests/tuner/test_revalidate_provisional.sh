#!/usr/bin/env bash
# A provisional winner, from its record to its re-decision, on a winner
# made provisional by hand (SQLite), so that no disturbance has to be
# staged: the suite's tests run side by side, and whether a round here is
# disturbed is left to chance and only checked for consistency.
#  1. db show and plan --explain say that the winner is provisional, with
#     its evidence.
#  2. A second tune, which measures nothing, carries the mark.
#  3. tune --revalidate decides it again: it times the finalists of the
#     round that chose it, interleaved, records each as a final-round
#     timing and the winner of that round as its own, and says so in its
#     table; that winner is provisional exactly when the table says the
#     round was disturbed again.
set -uo pipefail
cli="$1"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
. "$(dirname "$0")/../lib/checks.sh"
export ATTNRES_CACHE_DIR="${ATTNRES_TEST_KERNEL_CACHE:-$dir/cache}"
db="$dir/t.db"
key="mix:f32:d256:n5:h1:replace:epi0:s0:t64"
evidence="threads waited 90% of the window for a CPU, 0% stolen, 999 preemptions/s"
q() { python3 -c 'import sqlite3,sys; print("\n".join("|".join(str(v) for v in r) for r in sqlite3.connect(sys.argv[1]).execute(sys.argv[2])))' "$db" "$1"; }

printf 'mix f32 256 5 1 replace 0 64\n' >"$dir/p.txt"
expect_rc 0 "tune a small problem" -- "$cli" tune --device cpu --problems "$dir/p.txt" --db "$db" --strategy random --budget 3
finalists=$(q "select count(*) from measurements where run_id = 1 and final_round = 1 and status = 'ok'")
[ "$finalists" -ge 2 ] && ok "its final round timed $finalists finalists" || bad "final round: $finalists finalist(s)"
python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute(sys.argv[2], (sys.argv[3],)); c.commit()' \
  "$db" "update winners set provisional = 1, disturbance = ?" "$evidence"

# 1. What a user sees.
expect_rc 0 "db show" -- "$cli" db show --db "$db"
grep -q "^$key .* yes: $evidence" "$dir/out.txt" && ok "db show marks the winner provisional, with the evidence" ||
  bad "db show: $(cat "$dir/out.txt")"
grep -q "^1 provisional winner(s): .*attnres tune --revalidate" "$dir/out.txt" && ok "and says what decides it again" ||
  bad "no note below the table"
expect_rc 0 "plan --explain" -- "$cli" plan --device cpu --db "$db" --dtype f32 --d 256 --n 5 --explain
grep -q "^    provisional: the final round that chose it was disturbed by other work on every try ($evidence)" \
  "$dir/out.txt" && ok "plan --explain says the winner is provisional" || bad "plan: $(cat "$dir/out.txt")"

# 2. Tuning again decides from the same round on record: still provisional.
expect_rc 0 "tune again (nothing to measure)" -- "$cli" tune --device cpu --problems "$dir/p.txt" --db "$db" \
  --strategy random --budget 3
grep -q "^disturbed: .*: decided from a final round on record that was disturbed ($evidence): the winner is provisional" \
  "$dir/out.txt" && ok "the second run says its winner is provisional" || bad "second run: $(grep -i disturb "$dir/out.txt")"
[ "$(q "select provisional || '|' || disturbance from winners where run_id = 2")" = "1|$evidence" ] &&
  ok "and records it so" || bad "run 2's winner: $(q "select * from winners where run_id = 2")"

# 3. The re-decision.
expect_rc 0 "tune --revalidate" -- "$cli" tune --revalidate --device cpu --db "$db" --retries 0
row=$(grep "^$key " "$dir/out.txt")
echo "     $row"
case "$row" in
*" ok: stored under disturbance ($evidence); now "*"; re-decided: "*", of $finalists finalist(s) timed interleaved"*)
  ok "its row says what was stored, what it is now and what was decided" ;;
*) bad "row: $row" ;;
esac
grep -q ", 1 of 1 provisional re-decided (" "$dir/out.txt" && ok "the closing line counts it" ||
  bad "closing line: $(grep '^run ' "$dir/out.txt")"
[ "$(q "select count(*) from measurements where run_id = 3 and final_round = 1")" = "$finalists" ] &&
  ok "every finalist was timed again in a final round" ||
  bad "run 3's final timings: $(q "select candidate_id, status, final_round, message from measurements where run_id = 3")"
decided=$(sed -n 's/.*; re-decided: \([^ ]*\) .*/\1/p' <<<"$row")
[ "$(q "select c.variant from winners w join candidates c on c.id = w.candidate_id where w.run_id = 3")" = "$decided" ] &&
  ok "the winner recorded is the one named ($decided)" || bad "run 3's winner is not $decided"
[ "$(q "select count(*) from winners w join measurements m on m.id = w.measurement_id where w.run_id = 3 and m.run_id = 3 and m.final_round = 1")" = 1 ] &&
  ok "with its timing of this round" || bad "run 3's winner's measurement"
if grep -q "still provisional" <<<"$row"; then
  want=1
else
  want=0
fi
[ "$(q "select provisional from winners where run_id = 3")" = "$want" ] &&
  ok "provisional ($want) exactly when the round was disturbed again" || bad "run 3's mark is not $want"
if [ "$want" = 0 ]; then
  "$cli" db show --db "$db" >"$dir/show.txt"
  if grep -q "yes:" "$dir/show.txt"; then bad "db show still says provisional"; else ok "db show no longer says provisional"; fi
fi
expect_rc 0 "db revalidate takes --retries too" -- "$cli" db revalidate --device cpu --db "$db" --retries 0 --quiet
finish
