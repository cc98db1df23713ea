#!/usr/bin/env bash
# Quick start, step 1: build, then tune the default problem set on the best
# device present, writing attnres.db and printing the winners table.
# Arguments are passed to `attnres tune` (e.g. --preset ci).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
exec build/bin/attnres tune --db attnres.db "$@"
