#!/usr/bin/env bash
# The CUDA path end to end on the simulated driver (ATTNRES_CUDA_DRIVER, set
# by ctest): `attnres tune --device cuda:0 --preset ci` compiles, verifies,
# times and records every candidate; then `attnres run` on cuda:0 computes
# mix, phase 1 and phase 2 against the fp64 reference with the tuned winners
# and the built-in kernels; `attnres plan --explain` says which level served;
# `attnres tune --revalidate` re-measures every winner, phases included; a
# cubin the driver refuses is recompiled as PTX; and, with the simulated L2
# shrunk, the out-of-cache winners are paired with the CUDA stream pass.
#
#   test_tune_run_plan.sh CLI PYTHON WORKDIR
set -u -o pipefail
CLI=$1 PY=$2 WORK=$3
HERE=$(cd "$(dirname "$0")" && pwd)
DB=$WORK/sim-ci.db
. "$HERE/../lib/checks.sh"

[ -n "${ATTNRES_CUDA_DRIVER:-}" ] || { echo "ATTNRES_CUDA_DRIVER is not set"; exit 1; }
# NVRTC compiles the kernels; without it there is nothing to run (ctest: skip).
if ! { ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; } &&
   ! ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libnvrtc.so* >/dev/null 2>&1; then
    echo "SKIP: NVRTC not found (ldconfig, \$CUDA_HOME/lib64, /usr/local/cuda/lib64)"
    exit 77
fi
mkdir -p "$WORK" && rm -f "$DB" "$DB-wal" "$DB-shm"

devices=$("$CLI" devices 2>&1)
if grep -q '^cuda:0 .*(simulated)' <<<"$devices" && grep -q 'fingerprint cuda|.*|simulated$' <<<"$devices"; then
    ok "attnres devices lists cuda:0 as simulated"
else
    bad "attnres devices lists cuda:0 as simulated: $devices"
fi

start=$SECONDS
if "$CLI" tune --device cuda:0 --preset ci --db "$DB" >"$WORK/tune.log" 2>&1; then
    ok "tune --device cuda:0 --preset ci ($((SECONDS - start)) s)"
else
    bad "tune --device cuda:0 --preset ci: $(tail -5 "$WORK/tune.log")"
    finish
fi
# Every ci problem has a winner on the simulated device, and no candidate
# came back wrong or failed to launch.
winners=$(sqlite3 "$DB" "SELECT COUNT(*) FROM winners w JOIN devices d ON d.id = w.device_id WHERE d.simulated = 1 AND d.backend = 'cuda'")
notok=$(sqlite3 "$DB" "SELECT COUNT(*) FROM measurements WHERE status IN ('wrong_result', 'nondeterministic', 'launch_failed')")
if [ "$winners" = 5 ] && [ "$notok" = 0 ]; then
    ok "5 winners on the simulated device, no wrong result or failed launch"
else
    bad "winners on the simulated device: $winners (want 5), wrong or failed: $notok"
fi

# The run measured the CUDA ceilings: the driver's copy and the grid-stride
# read and copy kernels (real PTX from NVRTC, interpreted), and recorded them.
ceil=$(sqlite3 "$DB" "SELECT ceilings FROM runs ORDER BY id LIMIT 1")
read_gbps=$(sqlite3 "$DB" "SELECT read_gbps > 0 FROM runs ORDER BY id LIMIT 1")
if grep -q '"kernel": "read", "kind": "read", "threads": 4' <<<"$ceil" &&
   grep -q '"kernel": "copy", "kind": "copy"' <<<"$ceil" && grep -q '"kernel": "memcpy-dtod"' <<<"$ceil" &&
   [ "$read_gbps" = 1 ] && grep -q '^ceiling check: ' "$WORK/tune.log"; then
    ok "the run recorded the CUDA ceilings (copy, grid-stride read and copy) and checked its winners"
else
    bad "CUDA ceilings: read_gbps>0=$read_gbps, ceilings $ceil"
fi

for script in test_run_matches_reference.py test_run_phase_ops.py; do
    if ATTNRES_TEST_DEVICE=cuda:0 "$PY" "$HERE/../cli/$script" "$CLI" "$DB" >"$WORK/$script.log" 2>&1; then
        ok "$script on cuda:0 ($(tail -1 "$WORK/$script.log"))"
    else
        bad "$script on cuda:0: $(grep -E '^FAIL|failed' "$WORK/$script.log" | head -5)"
    fi
done

# Offered cubins first, the simulator refuses them (CUDA_ERROR_NO_BINARY_FOR_GPU)
# and the backend recompiles each kernel as PTX: the path a GPU newer than
# the NVRTC at hand takes.
if ATTNRES_CUDA_PTX=0 ATTNRES_TEST_DEVICE=cuda:0 "$PY" "$HERE/../cli/test_run_matches_reference.py" "$CLI" \
        >"$WORK/cubin-refused.log" 2>&1; then
    ok "a refused cubin is recompiled as PTX ($(tail -1 "$WORK/cubin-refused.log"))"
else
    bad "a refused cubin is recompiled as PTX: $(grep -E '^FAIL|failed' "$WORK/cubin-refused.log" | head -5)"
fi

plan=$("$CLI" plan --device cuda:0 --db "$DB" --dtype f32 --d 256 --n 5 --explain 2>&1)
if grep -q "exact device" <<<"$plan"; then
    ok "plan --explain on cuda:0 serves the tuned shape from the exact device"
else
    bad "plan --explain for the tuned shape: $plan"
fi
plan=$("$CLI" plan --device cuda:0 --db "$DB" --dtype f32 --d 320 --n 3 --explain 2>&1)
if grep -qi "generic" <<<"$plan"; then
    ok "plan --explain on cuda:0 falls back to the built-in kernel for an untuned shape"
else
    bad "plan --explain for an untuned shape: $plan"
fi

if "$CLI" tune --revalidate --device cuda:0 --db "$DB" >"$WORK/revalidate.log" 2>&1; then
    phases=$(grep -c 'phase[12]' "$WORK/revalidate.log")
    if [ "$phases" -ge 2 ]; then
        ok "tune --revalidate re-measures every winner on cuda:0, phases included"
    else
        bad "tune --revalidate did not re-measure the phase winners: $(tail -8 "$WORK/revalidate.log")"
    fi
else
    bad "tune --revalidate on cuda:0: $(tail -5 "$WORK/revalidate.log")"
fi

# With the simulated L2 shrunk to 64 KiB the ci preset's first problem
# (1.3 MB at T = 256) is out of cache, so the tuner pairs its winner's final
# rounds with the CUDA stream pass (the ceilings' kernels), reports
# `% paired` and records the paired check. The simulator's times are a
# model: what is checked is that the path runs and records, not the
# fractions. Two candidates (random, budget 2) take that path as the
# preset's 51 would, in a tenth of the time.
PAIRED_DB=$WORK/sim-paired.db
rm -f "$PAIRED_DB" "$PAIRED_DB-wal" "$PAIRED_DB-shm"
printf 'mix f32 256 5 1 replace 0 256\n' >"$WORK/paired-problems.txt"
if ATTNRES_CUDASIM_L2_BYTES=65536 "$CLI" tune --device cuda:0 --problems "$WORK/paired-problems.txt" \
        --strategy random --budget 2 --db "$PAIRED_DB" >"$WORK/tune-paired.log" 2>&1; then
    check=$(sqlite3 "$PAIRED_DB" "SELECT ceilings FROM runs ORDER BY id LIMIT 1" | grep -o '"check": {[^}]*}')
    passes=$(grep -c 'final round paired with a streaming pass: ' "$WORK/tune-paired.log")
    if grep -q '"paired": [1-9]' <<<"$check" && [ "$passes" -ge 1 ] &&
       grep -q '^paired check: [1-9][0-9]* winner(s) timed next to a streaming pass' "$WORK/tune-paired.log"; then
        ok "with a 64 KiB L2, $passes final round(s) on cuda:0 paired with the CUDA stream pass, and the run recorded the paired check"
    else
        bad "the CUDA stream pass: $passes paired round(s), check $check; $(grep -E '^paired check|stream pass' "$WORK/tune-paired.log" | head -3)"
    fi
else
    bad "tune --device cuda:0 with a 64 KiB L2: $(tail -5 "$WORK/tune-paired.log")"
fi
finish
