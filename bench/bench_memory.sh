#!/usr/bin/env bash
# bench_memory.sh [BUILD] — what a rank allocates against what the cost model predicts: the
# hidden-512 model of bench_train (8 layers, s 256, micro-batches of 4 sequences) on one CPU rank,
# one step in fp32 and one in bf16 (activations kept in bf16), printing the backend's allocation
# peak beside the plan's predicted memory less the device type's runtime reserve.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-release}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "| precision | allocated (GiB) | predicted less reserve (GiB) | allocated / predicted |"
echo "|---|---:|---:|---:|"
for precision in fp32 bf16; do
  python3 - bench/data/bench-1rank.json "$tmp/$precision.json" "$precision" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["inputs"].pop("digests", None)  # the training input changes with the precision
p["inputs"]["training"]["precision"] = sys.argv[3]
json.dump(p, open(sys.argv[2], "w"), indent=2)
PY
  "$build/executor/ffrun" "$tmp/$precision.json" --text LICENSE --steps 1 --quiet \
    --metrics "$tmp/$precision.jsonl"
  python3 - "$tmp/$precision.jsonl" "$precision" "$tmp/$precision.json" <<'PY'
import json, sys
m = json.loads(open(sys.argv[1]).readlines()[-1])
reserve = json.load(open(sys.argv[3]))["inputs"]["cluster"]["device_types"][0]["runtime_reserve_gib"]
pred = m["predicted"]["memory_gib"] - reserve
print("| %s | %.3f | %.3f | %.0f %% |" % (sys.argv[2], m["memory_gib"], pred, 100 * m["memory_gib"] / pred))
PY
done
