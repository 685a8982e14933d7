#!/usr/bin/env bash
# bench_checkpoint.sh [BUILD] — what saving a checkpoint costs each rank in host memory: the
# hidden-512 model of bench_train (25 M parameters, a 290 MiB checkpoint) under bench-dp2.json
# (two ranks, each holding the whole model), one step without a checkpoint and one step with
# checkpoints at steps 0 and 1, printing every rank's peak resident set (GNU time's %M) and what
# the checkpoints added to it. Rank 0 writes the file; the other rank only sends.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build-release}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
run() { # name, extra ffrun arguments...
  local name=$1
  shift
  mpirun -np 2 sh -c '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$tmp/$name" \
    "$build/executor/ffrun" bench/data/bench-dp2.json --text LICENSE --steps 1 --quiet "$@"
}
run plain
run saving --checkpoint-dir "$tmp/ckpt"
bytes=$(stat -c %s "$tmp/ckpt/step-00000001.safetensors")
echo "checkpoint: $((bytes / 1048576)) MiB"
echo "| rank | peak RSS, no checkpoint (MiB) | peak RSS, saving (MiB) | added by saving (MiB) |"
echo "|---:|---:|---:|---:|"
for r in 0 1; do
  a=$(tail -1 "$tmp/plain.$r")
  b=$(tail -1 "$tmp/saving.$r")
  echo "| $r | $((a / 1024)) | $((b / 1024)) | $(((b - a) / 1024)) |"
done
