#!/usr/bin/env bash
# The Slurm recipe of examples/slurm, its steps run here as Slurm would run
# them: three array tasks (SLURM_ARRAY_TASK_ID 0..2 of SLURM_ARRAY_TASK_COUNT 3,
# one SLURM_ARRAY_JOB_ID) each tune a shard of a tiny problem set on the CPU
# into their own database, then the merge job merges them and runs the
# deciding tune. The merged database must hold every candidate measured once
# (the shards disjoint, together what one unsharded run measures), the deciding
# run must measure nothing again, and every problem must have exactly one
# verified winner; the winners' variants are compared with those of one
# unsharded run (reported; timing noise may pick another member of an
# equivalent set).
#
# usage: test_slurm_recipe.sh ATTNRES_CLI SOURCE_DIR
set -euo pipefail
cli="$1"; src="$2"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
export ATTNRES="$cli" ATTNRES_DEVICE=cpu ATTNRES_WORKDIR="$dir/work" ATTNRES_RECIPE_DIR="$src/examples/slurm"
# The suite's kernel cache where ctest names one (compiling is not under test).
export ATTNRES_PROBLEMS="$dir/p.txt" ATTNRES_CACHE_DIR="${ATTNRES_TEST_KERNEL_CACHE:-$dir/cache}"
printf 'mix    f32 128 4 1 replace 0 1,40\nphase2 f32 256 1 1 replace 0 64\n' >"$ATTNRES_PROBLEMS"
pass=0; fail=0
ok() { echo "ok   $*"; pass=$((pass+1)); }
bad() { echo "FAIL $*"; fail=$((fail+1)); }

for s in tune-shard.sbatch merge.sbatch submit.sh common.sh; do
  if bash -n "$ATTNRES_RECIPE_DIR/$s"; then :; else bad "$s does not parse"; fi
done

# The array: job 4242, tasks 0..2 (job ids 4243..4245 as Slurm numbers them).
for i in 0 1 2; do
  if SLURM_ARRAY_JOB_ID=4242 SLURM_JOB_ID=$((4243 + i)) SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_TASK_COUNT=3 \
     SLURM_ARRAY_TASK_MIN=0 bash "$ATTNRES_RECIPE_DIR/tune-shard.sbatch" >"$dir/task$i.txt" 2>&1; then :; else
    bad "array task $i failed"; cat "$dir/task$i.txt"
  fi
done
work="$dir/work/4242"
[ -f "$work/shard-0.db" ] && [ -f "$work/shard-1.db" ] && [ -f "$work/shard-2.db" ] &&
  ok "three shard databases in $work" || bad "shard databases missing: $(ls "$work" 2>&1)"
# A task outside the array's range is refused before it tunes anything.
if SLURM_ARRAY_JOB_ID=4242 SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_COUNT=3 \
   bash "$ATTNRES_RECIPE_DIR/tune-shard.sbatch" >"$dir/task3.txt" 2>&1; then
  bad "task 3 of 3 ran"
else
  grep -q "not one of 3 consecutive tasks" "$dir/task3.txt" && ok "task 3 of 3 refused" || bad "task 3: $(cat "$dir/task3.txt")"
fi

# The merge job, after the array.
if SLURM_JOB_ID=4246 ATTNRES_ARRAY_JOB=4242 ATTNRES_SHARDS=3 \
   bash "$ATTNRES_RECIPE_DIR/merge.sbatch" >"$dir/merge.txt" 2>&1; then :; else
  bad "the merge job failed"; cat "$dir/merge.txt"
fi
merged="$work/attnres.db"
summary=$(grep '^run ' "$dir/merge.txt" || true)
grep -Eq ': 0 measured, [1-9][0-9]* reused' <<<"$summary" && ok "the deciding run measured nothing: $summary" ||
  bad "the deciding run: $summary"
if SLURM_JOB_ID=4247 ATTNRES_ARRAY_JOB=4242 ATTNRES_SHARDS=4 \
   bash "$ATTNRES_RECIPE_DIR/merge.sbatch" >"$dir/merge4.txt" 2>&1; then
  bad "a merge expecting 4 shards of 3 went on"
else
  ok "a merge expecting 4 shards of 3 stops"
fi

# One unsharded run of the same problems.
"$cli" tune --device cpu --problems "$ATTNRES_PROBLEMS" --db "$dir/one.db" --quiet >"$dir/one.txt"

q_measured="select count(*) from (select distinct m.candidate_id, m.problem_id from measurements m
  join runs r on r.id = m.run_id where r.strategy <> 'revalidate')"
q_dups="select count(*) from (select c.variant, p.key, m.run_id, count(*) n from measurements m
  join candidates c on c.id = m.candidate_id join problems p on p.id = m.problem_id
  group by c.variant, c.source_hash, p.key, m.run_id having count(distinct m.run_id) > 1)"
q_cross="select count(*) from (select c.variant, c.source_hash, p.key from measurements m
  join candidates c on c.id = m.candidate_id join problems p on p.id = m.problem_id
  group by c.variant, c.source_hash, p.key having count(distinct m.run_id) > 1)"
a=$(sqlite3 "$merged" "$q_measured"); b=$(sqlite3 "$dir/one.db" "$q_measured")
cross=$(sqlite3 "$merged" "$q_cross")
[ "$a" = "$b" ] && [ "$a" -gt 0 ] && [ "$cross" = 0 ] &&
  ok "the merged shards measured $a (candidate, problem) pairs once each, as the unsharded run" ||
  bad "merged $a pairs (measured by more than one run: $cross), unsharded $b"
runs=$(sqlite3 "$merged" "select count(*) from runs")
[ "$runs" = 4 ] && ok "the merged database holds the 3 shard runs and the deciding run" || bad "$runs runs"

# The deciding run's winners: one per problem (3 problems: 2 T buckets + 1).
last=$(sqlite3 "$merged" "select max(id) from runs")
q_winners="select p.key || ' ' || c.variant from winners w join problems p on p.id = w.problem_id
  join candidates c on c.id = w.candidate_id join measurements m on m.id = w.measurement_id
  where w.run_id = RUN and m.status = 'ok' order by p.key"
wm=$(sqlite3 "$merged" "${q_winners/RUN/$last}")
n=$(grep -c . <<<"$wm" || true)
distinct=$(cut -d' ' -f1 <<<"$wm" | sort -u | grep -c . || true)
[ "$n" = 3 ] && [ "$distinct" = 3 ] && ! grep -q 'none verified' "$dir/merge.txt" &&
  ok "every problem has one verified winner after the merge" || bad "winners after the merge: $wm"
one_last=$(sqlite3 "$dir/one.db" "select max(id) from runs")
wo=$(sqlite3 "$dir/one.db" "${q_winners/RUN/$one_last}")
same=$(comm -12 <(sort <<<"$wm") <(sort <<<"$wo") | grep -c . || true)
echo "info $same of 3 winners are the variants one unsharded run chose"
echo "     merged:    $(tr '\n' ';' <<<"$wm")"
echo "     unsharded: $(tr '\n' ';' <<<"$wo")"

# submit.sh refuses a bad shard count before it calls sbatch.
if bash "$ATTNRES_RECIPE_DIR/submit.sh" 0 >"$dir/submit.txt" 2>&1; then bad "submit.sh 0 went on"; else
  grep -q "positive number of shards" "$dir/submit.txt" && ok "submit.sh 0 refused" || bad "submit.sh 0: $(cat "$dir/submit.txt")"
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
