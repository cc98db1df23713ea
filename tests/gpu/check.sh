#!/usr/bin/env bash
# tests/gpu/check.sh - the one-command GPU check, for a machine with an
# NVIDIA GPU (written for a lent H200: no network, no Lua or SQLite
# development packages; only the driver, and NVRTC from a CUDA toolkit).
#
#   tests/gpu/check.sh [BUILD_DIR]
#
# BUILD_DIR (default: build) holds the already-built tree, carried from the
# development machine (configure it with -DATTNRES_STATIC_LUA=ON so that the
# tools need no Lua there; SQLite's shared library is in the base system); BUILD_DIR/bin/attnres is used (and bin/test_nvrtc
# when present), with the templates of this checkout. The script:
#   1. checks that the binary's shared libraries and NVRTC can be found;
#   2. runs `attnres devices` and requires cuda:0;
#   3. tunes the K3 and MHAR-8B presets on cuda:0 into one database: every
#      applicable CUDA variant is compiled with NVRTC, verified against the
#      fp64 reference (status wrong_result / compile_failed / launch_failed
#      otherwise) and timed;
#   4. tunes the backwards (DESIGN §1b) into that database from a problems
#      file: the mix backward at the same two shapes, and the Block AttnRes
#      phases' backwards at K3's block shape (phase1_backward, phase2_backward):
#      every variant of cuda/mix_backward.lua, phase1_backward.lua and
#      phase2_backward.lua is compiled, each gradient verified against the
#      fp64 reference backward, run twice and bit-compared (a candidate
#      whose runs differ is nondeterministic), and timed; then each backward
#      shape is planned on cuda:0 with an exact winner required (`attnres
#      plan --op OP --require-exact`), which also reports its workspace;
#   5. prints the winners (`attnres db show`) and, last, a short table of
#      candidate statuses per problem, the backward's included.
# Before tuning it runs BUILD_DIR/bin/test_nvrtc when present (the CUDA
# backend alone: generic kernels against the fp64 reference), and
# bin/test_cuda_stream_pass (the paired ceiling's pass) when present.
# Exit status: 0 when every step ran, no candidate came back wrong_result,
# nondeterministic or launch_failed and every backward shape has an exact
# winner; 1 otherwise.
#
# Environment:
#   OUT       where the database and logs go (default: BUILD_DIR/gpu-check)
#   PRESETS   presets to tune (default: "k3 mhar-8b"; "default" and
#             "delta-small" also exist; set but empty: none)
#   BACKWARD  a problems file (docs/problems.md) of mix_backward,
#             phase1_backward and phase2_backward lines to tune (default:
#             the mix backward at the K3 and MHAR-8B shapes in bf16 at T 1,
#             64, 4096 and 16384 and K3's with the epilogue at 64 and 4096,
#             and K3's phase backwards at 64 and 4096, written to
#             OUT/backward.problems); "none" skips the backwards
#   UNIT_TESTS  0 skips test_nvrtc and test_cuda_stream_pass (default: 1)
#   STRATEGY  tuner strategy (default: exhaustive, which times every
#             candidate fully; "halving" is quicker)
#   DEVICE    device spec (default: cuda:0)
set -u -o pipefail

BUILD=${1:-build}
BIN=$BUILD/bin/attnres
OUT=${OUT:-$BUILD/gpu-check}
PRESETS=${PRESETS-k3 mhar-8b}
BACKWARD=${BACKWARD:-}
UNIT_TESTS=${UNIT_TESTS:-1}
STRATEGY=${STRATEGY:-exhaustive}
DEVICE=${DEVICE:-cuda:0}
DB=$OUT/gpu-check.db
failed=0

say() { printf '== %s\n' "$*"; }
die() { printf 'check.sh: %s\n' "$*" >&2; exit 1; }

[ -x "$BIN" ] || die "no $BIN: build the project first (cmake -S . -B $BUILD && cmake --build $BUILD)"
mkdir -p "$OUT" || die "cannot create $OUT"
rm -f "$DB" "$DB-wal" "$DB-shm"

# 1. Libraries: the CLI links Lua and SQLite dynamically on most systems.
if command -v ldd >/dev/null 2>&1; then
    missing=$(ldd "$BIN" 2>/dev/null | awk '/not found/ {print $1}')
    [ -z "$missing" ] || die "$BIN cannot start, missing shared libraries: $missing (copy them next to it and set LD_LIBRARY_PATH)"
fi
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then
    export CUDA_HOME=/usr/local/cuda
fi
if ! { ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; } &&
   ! ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libnvrtc.so* >/dev/null 2>&1; then
    say "warning: libnvrtc not found by ldconfig or in \$CUDA_HOME/lib64; compiles will fail"
fi
export ATTNRES_CACHE_DIR=${ATTNRES_CACHE_DIR:-$OUT/cache}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export ATTNRES_TEMPLATE_DIR=${ATTNRES_TEMPLATE_DIR:-$ROOT/templates}

# 2. Devices.
say "attnres devices"
"$BIN" devices | tee "$OUT/devices.txt" || failed=1
grep -q "^${DEVICE}[[:space:]]" "$OUT/devices.txt" && ! grep -q "^${DEVICE}[[:space:]]*unavailable" "$OUT/devices.txt" ||
    die "$DEVICE is not available (see above)"
command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader

# 3. The backend on its own (if the unit test was built): the generic kernels
#    against the fp64 reference, copy bandwidth, empty launch, and every
#    variant compiled for sm_80 and sm_90.
if [ "$UNIT_TESTS" != 0 ] && [ -x "$BUILD/bin/test_nvrtc" ]; then
    say "test_nvrtc"
    "$BUILD/bin/test_nvrtc" 2>&1 | tee "$OUT/test_nvrtc.log" ||
        failed=1
fi
# The stream pass that pairs out-of-cache winners: on a GPU it moves real
# bytes through HBM (the K3 and MHAR presets at T >= 4096 exceed the L2).
if [ "$UNIT_TESTS" != 0 ] && [ -x "$BUILD/bin/test_cuda_stream_pass" ]; then
    say "test_cuda_stream_pass"
    "$BUILD/bin/test_cuda_stream_pass" 2>&1 | tee "$OUT/test_cuda_stream_pass.log" ||
        failed=1
fi

# 4. Tune (compile, verify, time) each preset.
declare -A took
for preset in $PRESETS; do
    say "attnres tune --device $DEVICE --preset $preset --strategy $STRATEGY"
    start=$(date +%s)
    if ! "$BIN" tune --device "$DEVICE" --preset "$preset" --strategy "$STRATEGY" --db "$DB" \
            2>&1 | tee "$OUT/tune-$preset.log"; then
        failed=1
    fi
    took[$preset]=$(( $(date +%s) - start ))
done

# 5. The backwards: tuned from a problems file, since the presets hold
#    forward problems only, then every shape planned with its exact winner.
if [ "$BACKWARD" != none ]; then
    if [ -z "$BACKWARD" ]; then
        BACKWARD=$OUT/backward.problems
        cat >"$BACKWARD" <<'EOF_PROBLEMS'
# The mix backward at the K3 and MHAR-8B shapes (tuner presets k3 and mhar-8b),
# and K3's with the output-norm epilogue (its own entry in every module).
mix_backward  bf16  7168  9  1  replace  0  1,64,4096,16384
mix_backward  bf16  4096  9  8  replace  0  1,64,4096,16384
mix_backward  bf16  7168  9  1  replace  1  64,4096
# The phases' backwards at K3's block shape (tuner preset k3's phase lines):
# 8 completed blocks against 24 sites, and one site's merge with a fused add.
phase1_backward  bf16  7168  8  1  replace  0  64,4096  s=24
phase2_backward  bf16  7168  1  1  replace  0  64,4096  fuse=1
EOF_PROBLEMS
    fi
    [ -r "$BACKWARD" ] || die "cannot read the backward problems file $BACKWARD"
    say "attnres tune --device $DEVICE --problems $BACKWARD --strategy $STRATEGY"
    start=$(date +%s)
    if ! "$BIN" tune --device "$DEVICE" --problems "$BACKWARD" --strategy "$STRATEGY" --db "$DB" \
            2>&1 | tee "$OUT/tune-backward.log"; then
        failed=1
    fi
    took[backward]=$(( $(date +%s) - start ))
    PRESETS="$PRESETS backward"
    shapes=0
    while read -r op dtype d n heads form epilogue _ extra; do
        case "$op" in ''|'#'*) continue ;; esac
        case "$op" in
            mix_backward|phase1_backward|phase2_backward) ;;
            *) die "$BACKWARD: '$op' is not a mix_backward, phase1_backward or phase2_backward line" ;;
        esac
        shapes=$((shapes + 1))
        flags=()
        [ "$form" = additive ] && flags+=(--additive)
        [ "$epilogue" = 1 ] && flags+=(--epilogue)
        for kv in $extra; do
            case "$kv" in
                s=*) flags+=(--s "${kv#s=}") ;;
                fuse=1) flags+=(--fuse-add) ;;
            esac
        done
        say "attnres plan --op $op --dtype $dtype --d $d --n $n --heads $heads ${flags[*]-} --require-exact"
        if ! "$BIN" plan --device "$DEVICE" --db "$DB" --op "$op" --dtype "$dtype" --d "$d" --n "$n" \
                --heads "$heads" ${flags[@]+"${flags[@]}"} --require-exact --explain 2>&1 |
                tee -a "$OUT/plan-backward.txt"; then
            failed=1
        fi
    done < <(sed 's/#.*//' "$BACKWARD")
    [ "$shapes" -gt 0 ] || { say "no backward line in $BACKWARD"; failed=1; }
fi

# 6. Winners, then the status table.
say "attnres db show"
"$BIN" db show --db "$DB" | tee "$OUT/winners.txt" || failed=1

"$BIN" db export --csv --table measurements --db "$DB" --out "$OUT/measurements.csv" >/dev/null 2>&1 || true
say "candidates by status (from $OUT/measurements.csv)"
if [ -s "$OUT/measurements.csv" ] && command -v python3 >/dev/null 2>&1; then
    python3 - "$OUT/measurements.csv" <<'EOF' || failed=1
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1], newline="")))
count = collections.Counter((r["problem"], r["status"]) for r in rows)
problems = sorted({r["problem"] for r in rows})
statuses = ["ok", "wrong_result", "nondeterministic", "compile_failed", "launch_failed", "skipped"]
statuses += sorted({s for _, s in count} - set(statuses))
print("%-44s" % "problem" + "".join("%15s" % s for s in statuses))
for p in problems:
    print("%-44s" % p[:44] + "".join("%15d" % count[(p, s)] for s in statuses))
bad = [r for r in rows if r["status"] in ("wrong_result", "nondeterministic", "launch_failed")]
for r in bad[:20]:
    print("BAD %s %s %s: %s" % (r["problem"], r["variant"], r["status"], r["message"][:200]))
sys.exit(1 if bad else 0)
EOF
elif [ -s "$OUT/measurements.csv" ]; then
    echo "(python3 not found: see $OUT/measurements.csv)"
    grep -q ',wrong_result,\|,nondeterministic,\|,launch_failed,' "$OUT/measurements.csv" && failed=1
else
    echo "(no measurements exported)"
    failed=1
fi

printf '\n%-14s %8s\n' preset seconds
for preset in $PRESETS; do printf '%-14s %8s\n' "$preset" "${took[$preset]:-?}"; done
if [ "$failed" -eq 0 ]; then say "GPU check passed"; else say "GPU check FAILED (logs in $OUT)"; fi
exit "$failed"
