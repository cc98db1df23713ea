#!/usr/bin/env bash
# Quick start, step 2: build and run the whole test suite. ctest prints the
# closing summary of passed and failed tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
