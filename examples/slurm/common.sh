# Settings shared by the job scripts of this recipe (sourced, not run).
# Every one can be set in the environment of `submit.sh` (sbatch passes it on).
#   ATTNRES           the attnres command line (default: attnres on PATH)
#   ATTNRES_WORKDIR   a directory every node sees (default: ./attnres-tune)
#   ATTNRES_DEVICE    the device each task tunes (default: cuda:0, the GPU Slurm
#                     granted the task: it sets CUDA_VISIBLE_DEVICES to it)
#   ATTNRES_PRESET    a problem preset (default: default), or
#   ATTNRES_PROBLEMS  a problems file (docs/problems.md), which wins over the preset
#   ATTNRES_TUNE_ARGS more `attnres tune` options, the same for every step
#                     (e.g. "--strategy exhaustive"; word-split)
ATTNRES=${ATTNRES:-attnres}
ATTNRES_WORKDIR=${ATTNRES_WORKDIR:-$PWD/attnres-tune}
ATTNRES_DEVICE=${ATTNRES_DEVICE:-cuda:0}
if [ -n "${ATTNRES_PROBLEMS:-}" ]; then
  problem_args=(--problems "$ATTNRES_PROBLEMS")
else
  problem_args=(--preset "${ATTNRES_PRESET:-default}")
fi
# shellcheck disable=SC2206
extra_args=(${ATTNRES_TUNE_ARGS:-})
