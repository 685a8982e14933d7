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
ffplan=$build/planner/ffplan
# Metrics through the strict reader, `ffplan metrics`; the first step warms up. The DP time of a
# step is its slowest stage's; the prediction is the plan's, as ffrun wrote it beside them.
"$ffplan" metrics "$tmp/one.jsonl" --get step,tokens_per_second >"$tmp/one.tsv"
"$ffplan" metrics "$tmp/two.jsonl" --get step,tokens_per_second >"$tmp/two.tsv"
"$ffplan" metrics "$tmp/two.jsonl" --stages --get step,dp_seconds,predicted_dp_seconds \
  >"$tmp/two-dp.tsv"
python3 - "$tmp/one.tsv" "$tmp/two.tsv" "$tmp/two-dp.tsv" <<'PY'
import sys
rows = lambda f: [[float(x) for x in l.split("\t")] for l in open(f)]
one, two, stages = rows(sys.argv[1])[1:], rows(sys.argv[2])[1:], rows(sys.argv[3])
tps1 = sum(r[1] for r in one) / len(one)
tps2 = sum(r[1] for r in two) / len(two)
dp = {}
for step, seconds, _ in stages:
    dp[step] = max(dp.get(step, 0.0), seconds)
dp = sum(dp[r[0]] for r in two) / len(two)
pred = next(s[2] for s in stages if s[0] == stages[-1][0])  # the last step's first
print("| ranks | tokens/s (one rank) | tokens/s (two ranks, DP) | speed-up | target | DP all-reduce measured (s) | predicted (s) |")
print("|---:|---:|---:|---:|---|---:|---:|")
print("| 2 | %.0f | %.0f | %.2fx | >= 1.7x | %.4f | %.4f |" % (tps1, tps2, tps2 / tps1, dp, pred))
PY
