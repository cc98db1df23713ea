#!/usr/bin/env bash
# Quick start, step 2: build and run the whole test suite. ctest prints the
# closing summary of passed and failed tests; then the Python package is
# installed into a virtual environment under build/ (linking the libattnres
# just built, so only the extension is compiled) and pytest prints its own.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" "$@")

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
