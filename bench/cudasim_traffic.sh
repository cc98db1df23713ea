#!/usr/bin/env bash
# bench/cudasim_traffic.sh [BUILD_DIR] [cudasim_traffic options] - memory
# traffic of the default CUDA variants (and the generic kernels) of
# cuda/mix_online, cuda/mix_twopass, cuda/phase1, cuda/phase2 and the
# backwards cuda/mix_backward, cuda/phase1_backward and cuda/phase2_backward
# on the K3 and MHAR-8B shapes, counted by the simulated driver
# (docs/cudasim.md) and set against DESIGN §2's minimal traffic; prints a
# markdown table (bench/cudasim_traffic.c says what each column is). Builds
# nothing: build the targets cudasim_traffic and attnres_cudasim first (both
# come with the tests, ATTNRES_TESTS=ON, since the simulator is theirs).
# Options after BUILD_DIR go to the program (--tokens 8,1, --only SUBSTRING).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift || true
sim=$build/lib/libattnres-cudasim.so
for f in "$build/bin/cudasim_traffic" "$sim"; do
  [ -e "$f" ] || { echo "bench/cudasim_traffic.sh: $f is missing; build first" >&2; exit 1; }
done
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo ", with local changes" || true)
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
echo "Commit: $commit$dirty. Host: ${cpu:-unknown CPU}, $(nproc) cores."
echo
ATTNRES_CUDA_DRIVER=$sim ATTNRES_TEMPLATE_DIR=$root/templates ATTNRES_CACHE_DIR=$cache \
  "$build/bin/cudasim_traffic" "$@"
