#!/usr/bin/env bash
# Installs missing build dependencies, then configures and builds attnres
# into ./build (Release with debug info). Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j"$(nproc)"
