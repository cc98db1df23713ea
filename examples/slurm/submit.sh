#!/usr/bin/env bash
# Submits a sharded tuning job: an array of N tasks (one GPU each, N shards of
# the candidates), and the merge job that runs only if every task succeeded.
#
#   examples/slurm/submit.sh N [extra sbatch options for both jobs]
#   ATTNRES_PRESET=k3 ATTNRES=$PWD/build/bin/attnres examples/slurm/submit.sh 8 -p gpu
#
# Run it from the attnres tree (or set ATTNRES_RECIPE_DIR to this folder).
# The merged database is ATTNRES_WORKDIR/ARRAY_JOB/attnres.db.
set -euo pipefail
n=${1:?usage: submit.sh N [sbatch options]}
shift
here=${ATTNRES_RECIPE_DIR:-$(cd "$(dirname "$0")" && pwd)}
export ATTNRES_RECIPE_DIR=$here
case $n in '' | *[!0-9]* | 0) echo "submit.sh: N must be a positive number of shards" >&2; exit 2 ;; esac
array=$(sbatch --parsable --array="0-$((n - 1))" --export=ALL "$@" "$here/tune-shard.sbatch")
array=${array%%;*} # --parsable prints "id" or "id;cluster"
merge=$(sbatch --parsable --dependency="afterok:$array" --kill-on-invalid-dep=yes \
  --export="ALL,ATTNRES_ARRAY_JOB=$array,ATTNRES_SHARDS=$n" "$@" "$here/merge.sbatch")
echo "tuning array $array ($n shards), merge job ${merge%%;*} after it"
echo "merged database: ${ATTNRES_WORKDIR:-$PWD/attnres-tune}/$array/attnres.db"
