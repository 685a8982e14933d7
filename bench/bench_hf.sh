#!/usr/bin/env bash
# bench_hf.sh [BUILD] — time and peak resident memory of Hugging Face weights in and out: a
# Llama of 36.5 M parameters (146 MB in fp32, vocab 65,536) made with transformers, one step of
# one rank from random weights and from --init-from, a --resume from its checkpoint (437 MB with
# the moments), `ffrun export` in fp32 and bf16; then each rank of a TP 2 + PP 2 plan with and
# without --init-from. Prints a table (GNU time's elapsed seconds and maximum resident set).
# Needs .venv (scripts/setup).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ffrun=$build/executor/ffrun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

.venv/bin/python tests/cli/big_llama.py "$tmp"

row() { # label command...: one table row from GNU time
  local label=$1
  shift
  /usr/bin/time -f "%e %M" -o "$tmp/t" "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
  read -r secs kib <"$tmp/t"
  printf '| %s | %.2f | %d |\n' "$label" "$secs" $((kib / 1024))
}
echo "| run (one rank) | seconds | peak RSS (MiB) |"
echo "|---|---:|---:|"
row "ffrun --help (the program alone)" "$ffrun" --help
row "1 step, random weights" "$ffrun" "$tmp/one.json" --text LICENSE --steps 1 --quiet
row "1 step, --init-from (146 MB fp32)" "$ffrun" "$tmp/one.json" --text LICENSE --steps 1 --quiet \
  --init-from "$tmp/big"
row "1 step, --init-from, checkpoints at 0 and 1" "$ffrun" "$tmp/one.json" --text LICENSE --steps 1 \
  --quiet --init-from "$tmp/big" --checkpoint-dir "$tmp/ck"
row "1 more step, --resume (437 MB checkpoint)" "$ffrun" "$tmp/one.json" --text LICENSE --steps 2 \
  --quiet --checkpoint-dir "$tmp/ck" --resume
row "ffrun export, fp32" "$ffrun" export "$tmp/ck" -o "$tmp/e32" --quiet
row "ffrun export, bf16, 20 MB shards" "$ffrun" export "$tmp/ck" -o "$tmp/e16" --dtype bf16 \
  --max-shard-size 20MB --quiet
echo
echo "| rank (TP 2 + PP 2) | peak RSS, random (MiB) | peak RSS, --init-from (MiB) | added (MiB) |"
echo "|---:|---:|---:|---:|"
for mode in random init; do
  extra=()
  [ "$mode" = init ] && extra=(--init-from "$tmp/big")
  mpirun -np 4 sh -c '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$tmp/rss.$mode" \
    "$ffrun" "$tmp/four.json" --text LICENSE --steps 1 --quiet "${extra[@]}" >/dev/null
done
for r in 0 1 2 3; do
  a=$(tail -1 "$tmp/rss.random.$r") b=$(tail -1 "$tmp/rss.init.$r")
  echo "| $r | $((a / 1024)) | $((b / 1024)) | $(((b - a) / 1024)) |"
done
