# killed_tuners.sh - the scratch directory and the clean-up of a shell test
# that starts tuners in order to kill them, sourced at its start (before
# checks.sh, which runs this EXIT trap after its own). Whatever happens to
# the test, it leaves no process of its own behind: the tuner it started
# last ($tuner, empty when none is running) and the children that outlived
# a tuner ($survivors) are killed by pid, then $dir is removed.
dir=$(mktemp -d)
tuner=""
survivors=()
killed_tuners_cleanup() {
  [ -n "$tuner" ] && kill -9 "$tuner" 2>/dev/null || true
  for c in "${survivors[@]}"; do kill -9 "$c" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap killed_tuners_cleanup EXIT
