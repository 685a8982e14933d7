#!/usr/bin/env bash
# bench_memory.sh [BUILD] — what a rank allocates against what the cost model predicts: the
# hidden-512 model of bench_train (8 layers, s 256, micro-batches of 4 sequences) on one CPU rank,
# one step in fp32 and in bf16 (activations kept in bf16), each without recompute and with full
# recompute, printing the backend's allocation peak beside the plan's predicted memory less the
# device type's runtime reserve, and the step's time.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| precision | recompute | allocated (GiB) | predicted less reserve (GiB) | allocated / predicted | step (s) |"
echo "|---|---|---:|---:|---:|---:|"
for recompute in none full; do
  for precision in fp32 bf16; do
    name=$precision-$recompute
    python3 - bench/data/bench-1rank.json "$tmp/$name.json" "$precision" "$recompute" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)  # the training input changes with the precision
p["inputs"]["training"]["precision"] = sys.argv[3]
p["inputs"]["training"]["recompute"] = sys.argv[4]
for pl in p["pipelines"]:
    for st in pl["stages"]:
        st["recompute"] = sys.argv[4]
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
    "$build/executor/ffrun" "$tmp/$name.json" --text LICENSE --steps 1 --quiet \
      --metrics "$tmp/$name.jsonl"
    # the last step's figures through the strict reader, `ffplan metrics`
    "$build/planner/ffplan" metrics "$tmp/$name.jsonl" \
      --get memory_gib,predicted_memory_gib,step_seconds | tail -1 >"$tmp/$name.tsv"
    python3 - "$tmp/$name.tsv" "$precision" "$recompute" "$tmp/$name.json" <<'PY'
import json, sys
memory, predicted, step = map(float, open(sys.argv[1]).read().split("\t"))
reserve = json.load(open(sys.argv[4]))["inputs"]["cluster"]["device_types"][0]["runtime_reserve_gib"]
pred = predicted - reserve
print("| %s | %s | %.4f | %.4f | %.2f %% | %.2f |" % (sys.argv[2], sys.argv[3], memory, pred,
      100 * memory / pred, step))
PY
  done
done
