# checks.sh - the counting helpers the shell tests share, sourced by them.
# Each check prints one "ok"/"FAIL" line; finish prints the closing
# "N passed, M failed" summary and exits non-zero when anything failed.
# expect_rc keeps the command's output in $dir/out.txt and $dir/err.txt, so
# a test that sources this file sets $dir (its scratch directory) first.
# A test that fails prints the command that reruns it (see the end).

passed=0
failed=0

ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }

# expect_rc WANT NAME -- command...: runs the command and checks its exit
# status; on a mismatch shows the end of what it printed.
expect_rc() {
  local want="$1" name="$2"
  shift 3
  "$@" >"$dir/out.txt" 2>"$dir/err.txt"
  local rc=$?
  if [ "$rc" = "$want" ]; then ok "$name (exit $rc)"; else
    bad "$name: exit $rc, want $want"
    sed 's/^/     | /' "$dir/out.txt" "$dir/err.txt" | tail -20
  fi
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

# On a failure, the command that reruns the test: "rerun: [env ATTNRES_...]
# bash SCRIPT ARGS", with the arguments and the ATTNRES_ variables the
# script started with (ctest sets some; /proc keeps the environment as it
# was at exec, before the script exported its own). An EXIT trap prints it
# on any status but 0 (passed) and 77 (skipped), then runs the script's own
# EXIT trap, which a script therefore sets before it sources this file.
checks_rerun=$(printf '%q ' bash "$(realpath "$0")" "$@")
checks_rerun_env=""
if [ -r /proc/$$/environ ]; then
  while IFS= read -r -d '' checks_kv; do
    case $checks_kv in ATTNRES_*) checks_rerun_env+=$(printf '%q ' "$checks_kv") ;; esac
  done </proc/$$/environ
fi
if [ -n "$checks_rerun_env" ]; then checks_rerun="env $checks_rerun_env$checks_rerun"; fi
checks_exit_trap=""
checks_take_trap() { checks_exit_trap=$2; } # called as: trap -- COMMAND EXIT
eval "$(trap -p EXIT | sed 's/^trap /checks_take_trap /')"
checks_on_exit() {
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then echo "rerun: ${checks_rerun% }"; fi
  eval "$checks_exit_trap"
  exit "$rc"
}
trap checks_on_exit EXIT
