# checks.sh - the counting helpers the shell tests share, sourced by them.
# Each check prints one "ok"/"FAIL" line; finish prints the closing
# "N passed, M failed" summary and exits non-zero when anything failed.
# expect_rc keeps the command's output in $dir/out.txt and $dir/err.txt, so
# a test that sources this file sets $dir (its scratch directory) first.

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
