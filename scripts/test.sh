#!/usr/bin/env bash
# Quick start, step 2: build and run the fast test tier (docs/testing.md),
# or with --full every test. ctest prints the closing summary of passed and
# failed tests, then this script the ten slowest; then the Python package
# is installed into a virtual environment under build/ (linking the
# libattnres just built, so only the extension is compiled) and pytest
# prints its own summary. Other arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
tier=(-L fast)
args=()
for a in "$@"; do
  if [ "$a" = --full ]; then tier=(); else args+=("$a"); fi
done
bash scripts/build.sh
log=build/ctest-last.log
set +e
(cd build && ctest --output-on-failure -j"$(nproc)" "${tier[@]}" "${args[@]}") 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
echo "the ten slowest tests:"
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) [.* ]*\([A-Za-z*]*[^0-9]*\) *\([0-9.]*\) sec$/\3 \1/p' "$log" |
  sort -rn | head -10 | awk '{printf "  %8.1f s  %s\n", $1, $2}'
[ "$rc" -eq 0 ] || exit "$rc"

# The Python tests. PyPI provides the build backend, NumPy and pytest; torch
# is not installed here (its tests skip, saying so).
# Debian's python3 keeps the C headers and venv in separate packages.
if ! python3 -c 'import ensurepip, os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  echo "attnres: installing python3-dev python3-venv for the Python tests" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-dev python3-venv >/dev/null
fi
venv=build/pyvenv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check numpy pytest
"$venv/bin/python" -m pip install -q --disable-pip-version-check ./python \
  -C cmake.define.ATTNRES_BUILD_DIR="$PWD/build"
"$venv/bin/python" -m pytest -q -rs python/tests
