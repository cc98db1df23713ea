#!/usr/bin/env bash
# The source tree configures and builds with -DATTNRES_CUDA=OFF, as the
# README promises: a machine without any interest in GPUs must not need the
# CUDA backend's code to link the library or the command line. Only the
# library and command line targets are built (no tests, no benchmarks), so
# that the check stays cheap; the built tool must then report CUDA as not
# built in and still list the CPU.
# Usage: test_build_no_cuda.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/attnres-nocuda-XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

echo "== configure $src with -DATTNRES_CUDA=OFF"
# Release: no debug information, which a check of the configuration does
# not read (-g took a quarter of a kernel's compile time).
cmake -S "$src" -B "$work/build" -DATTNRES_CUDA=OFF -DATTNRES_TESTS=OFF -DATTNRES_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; fail "configure"; }
echo "== build the library and the command line"
jobs=$(nproc 2>/dev/null || echo 2)
cmake --build "$work/build" -j "$jobs" --target attnres attnres_static attnres_cli >"$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; fail "build with -DATTNRES_CUDA=OFF"; }
cli="$work/build/bin/attnres"
[ -x "$cli" ] || fail "no $cli"
"$cli" devices >"$work/devices.txt" 2>&1 || { cat "$work/devices.txt"; fail "attnres devices"; }
grep -q '^cpu ' "$work/devices.txt" || { cat "$work/devices.txt"; fail "the CPU is not listed"; }
grep -q 'built without CUDA support' "$work/devices.txt" || { cat "$work/devices.txt"; fail "CUDA not reported as absent"; }
echo "ok   -DATTNRES_CUDA=OFF builds; attnres devices lists the CPU and says CUDA is not built in"
