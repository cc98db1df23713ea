#!/usr/bin/env bash
# tests/gpu/check.sh, the one-command check for a lent GPU, on the simulated
# driver (ATTNRES_CUDA_DRIVER, set by ctest), so that its steps are known to
# run before they meet real hardware: with no forward preset and small
# backwards of each op (tests/gpu/sim-backward.problems), the script tunes
# them on cuda:0 with every candidate verified, plans each with an exact
# winner required, prints its workspace and the status table, and passes.
#
#   test_gpu_check_script.sh BUILD_DIR WORKDIR
set -u -o pipefail
BUILD=$1 WORK=$2
HERE=$(cd "$(dirname "$0")" && pwd)
SCRIPT=$HERE/../gpu/check.sh
. "$HERE/../lib/checks.sh"

[ -n "${ATTNRES_CUDA_DRIVER:-}" ] || { echo "ATTNRES_CUDA_DRIVER is not set"; exit 1; }
if bash -n "$SCRIPT"; then ok "bash -n tests/gpu/check.sh"; else bad "bash -n tests/gpu/check.sh"; finish; fi
# NVRTC compiles the kernels; without it there is nothing to run (ctest: skip).
if ! { ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; } &&
   ! ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libnvrtc.so* >/dev/null 2>&1; then
    echo "SKIP: NVRTC not found (ldconfig, \$CUDA_HOME/lib64, /usr/local/cuda/lib64)"
    exit 77
fi
rm -rf "$WORK" && mkdir -p "$WORK"

start=$SECONDS
OUT=$WORK PRESETS= BACKWARD=$HERE/../gpu/sim-backward.problems UNIT_TESTS=0 STRATEGY=halving DEVICE=cuda:0 \
    bash "$SCRIPT" "$BUILD" >"$WORK/check.log" 2>&1
rc=$?
if [ "$rc" = 0 ] && grep -q '^== GPU check passed$' "$WORK/check.log"; then
    ok "check.sh passes on the simulated cuda:0 ($((SECONDS - start)) s)"
else
    bad "check.sh on the simulated cuda:0: exit $rc"
    tail -30 "$WORK/check.log" | sed 's/^/     | /'
fi
if grep -q 'attnres tune --device cuda:0 --problems .*sim-backward.problems' "$WORK/check.log"; then
    ok "the backwards were tuned on cuda:0 from the problems file"
else
    bad "no tune of the backwards in the log"
fi
# The status table has each backward op's problems, with verified
# candidates and none wrong, nondeterministic or failed to launch.
for op in mix_backward phase1_backward phase2_backward; do
    row=$(sed -n '/^== candidates by status/,$p' "$WORK/check.log" | grep -E "^$op:" | head -1)
    read -r _ okc wrong nondet _ launch _ <<<"$row"
    if [ -n "$row" ] && [ "${okc:-0}" -gt 0 ] 2>/dev/null && [ "$wrong" = 0 ] && [ "$nondet" = 0 ] &&
       [ "$launch" = 0 ]; then
        ok "status table: $okc verified $op candidates, none wrong or failed"
    else
        bad "status table row of $op: '$row'"
    fi
done
# One plan per line of the problems file, each an exact winner with its workspace.
plans=$(grep -c '^plan level: exact device' "$WORK/plan-backward.txt" 2>/dev/null)
workspaces=$(grep -c '^workspace: [0-9]* bytes' "$WORK/plan-backward.txt" 2>/dev/null)
lines=$(grep -cE '^(mix|phase1|phase2)_backward ' "$HERE/../gpu/sim-backward.problems")
if [ "${plans:-0}" = "$lines" ] && [ "${workspaces:-0}" = "$lines" ]; then
    ok "plan --op OP --require-exact serves each of the $lines tuned winners and reports its workspace"
else
    bad "plans of the backwards: $plans exact and $workspaces workspaces of $lines: $(head -5 "$WORK/plan-backward.txt" 2>/dev/null)"
fi
if grep -q '^backward ' "$WORK/check.log"; then
    ok "the time table lists the backwards' tune"
else
    bad "the time table has no backward line"
fi
finish
