#!/usr/bin/env bash
# bench_dp.sh [BUILD] — data parallelism on this machine's two cores: the hidden-512 model of
# bench_train trained for 3 steps on one rank and on two (same global batch of 8 sequences:
# 2 micro-batches of 4 on one rank, one micro-batch of 4 on each of two), printing tokens/s of
# the last two steps, the speed-up, and the data-parallel gradient all-reduce time measured beside
# the cost model's prediction for the same plan (from the metrics' per-stage figures).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/executor/ffrun" bench/data/bench-1rank.json --text LICENSE --quiet --metrics "$tmp/one.jsonl"
mpirun -np 2 --bind-to core "$build/executor/ffrun" bench/data/bench-dp2.json --text LICENSE --quiet \
  --metrics "$tmp/two.jsonl"
python3 - "$tmp/one.jsonl" "$tmp/two.jsonl" <<'PY'
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])][1:]
two = [json.loads(l) for l in open(sys.argv[2])][1:]
tps1 = sum(x["tokens_per_second"] for x in one) / len(one)
tps2 = sum(x["tokens_per_second"] for x in two) / len(two)
dp = sum(max(s["dp_seconds"] for s in x["stages"]) for x in two) / len(two)
pred = two[-1]["stages"][0]["predicted"]["dp_seconds"]
print("| ranks | tokens/s (one rank) | tokens/s (two ranks, DP) | speed-up | target | DP all-reduce measured (s) | predicted (s) |")
print("|---:|---:|---:|---:|---|---:|---:|")
print("| 2 | %.0f | %.0f | %.2fx | >= 1.7x | %.4f | %.4f |" % (tps1, tps2, tps2 / tps1, dp, pred))
PY
