#!/usr/bin/env bash
# bench_hetero.sh [BUILD] — the end-to-end proof on one machine: an emulated heterogeneous cluster
# of four CPU ranks, two of them three times slower than the other two, is profiled, planned
# (ffplan's plan and the uniform, Megatron-style baseline), and trained by ffrun, alternating the
# two plans; one calibration on a run of ffplan's plan fits the profile, and both plans' predicted
# iteration times are compared with what ffrun measured.
#
# The fast ranks are emulated at 4x and the slow ones at 12x (--throttle 0=4,1=4,2=12,3=12): the
# slow devices are 3x slower than the fast ones, and waiting instead of computing keeps the four
# ranks' demand (2 x 1/4 + 2 x 1/12 of a core) well below this machine's two cores, so ranks seldom
# slow each other down by sharing a core — which no cluster profile could describe — and the
# compute of a step outweighs the latency of its many small TP all-reduces, as on GPUs.
# FF_HETERO_THROTTLE, FF_HETERO_STEPS and FF_HETERO_ROUNDS change the setting.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ffplan=$build/planner/ffplan
ffrun=$build/executor/ffrun
out=${FF_HETERO_OUT:-$(mktemp -d)}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
model=profiles/models/tiny.json
training=profiles/training/tiny.json
steps=${FF_HETERO_STEPS:-30}
rounds=${FF_HETERO_ROUNDS:-5}
throttle=${FF_HETERO_THROTTLE:-0=4,1=4,2=12,3=12}

ranks() { grep -c '"rank":' "$1"; } # a plan's ranks: the planner may leave slow GPUs idle

echo "== 1. profile: mpirun -np 4 ffrun profile --throttle $throttle"
mpirun -np 4 "$ffrun" profile -o "$out/cluster.json" --model "$model" --throttle $throttle
"$ffplan" validate "$out/cluster.json"
echo "== 2. plan: ffplan plan, and --baseline uniform"
"$ffplan" plan --cluster "$out/cluster.json" --model "$model" --training "$training" -o "$out/ffplan.json"
"$ffplan" plan --cluster "$out/cluster.json" --model "$model" --training "$training" \
  --baseline uniform -o "$out/uniform.json"
"$ffplan" show "$out/ffplan.json" | sed -n '/^pipeline/,$p'
echo "== 3. calibrate on one run of ffplan's plan"
mpirun -np "$(ranks "$out/ffplan.json")" "$ffrun" "$out/ffplan.json" --text LICENSE --steps 20 --quiet --metrics "$out/calibration.jsonl"
"$ffplan" calibrate --plan "$out/ffplan.json" --metrics "$out/calibration.jsonl" \
  --cluster "$out/cluster.json" -o "$out/calibrated.json" | sed -n '1,/^term/p' | sed '$d'
echo "== 4. train both plans, alternating, $steps steps each, $rounds rounds"
for round in $(seq "$rounds"); do
  for plan in ffplan uniform; do
    mpirun -np "$(ranks "$out/$plan.json")" "$ffrun" "$out/$plan.json" --text LICENSE \
      --steps "$steps" --quiet --metrics "$out/$plan-$round.jsonl"
  done
done
for plan in ffplan uniform; do
  "$ffplan" simulate "$out/$plan.json" --json >"$out/$plan-before.json"
  "$ffplan" simulate "$out/$plan.json" --cluster "$out/calibrated.json" --json >"$out/$plan-after.json"
  for round in $(seq "$rounds"); do # step times through the strict reader
    "$ffplan" metrics "$out/$plan-$round.jsonl" --get step_seconds >"$out/$plan-$round.tsv"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for plan in ("ffplan", "uniform"):
    medians = []
    for r in range(1, rounds + 1):
        steps = [float(l) for l in open("%s/%s-%d.tsv" % (d, plan, r))][2:]
        medians.append(statistics.median(steps))
    measured = statistics.median(medians)
    before = json.load(open("%s/%s-before.json" % (d, plan)))["iteration_seconds"]
    after = json.load(open("%s/%s-after.json" % (d, plan)))["iteration_seconds"]
    tokens = json.load(open("%s/%s.json" % (d, plan)))["inputs"]["training"]["global_batch"] * \
        json.load(open("%s/%s.json" % (d, plan)))["inputs"]["model"]["seq_len"]
    rows[plan] = (measured, before, after, tokens / measured)
print()
print("| plan | measured s/step (median of %d rounds) |" % rounds + " tokens/s | predicted (profile) | predicted (after one calibration) | error after |")
print("|---|---:|---:|---:|---:|---:|")
for plan, (m, b, a, tps) in rows.items():
    name = "ffplan plan" if plan == "ffplan" else "--baseline uniform"
    print("| %s | %.4f | %.0f | %.4f | %.4f | %+.1f %% |" % (name, m, tps, b, a, 100 * (a - m) / m))
print()
print("ffplan's plan trains %.2fx as fast as the uniform plan (measured; the ideal here is 2x)"
      % (rows["ffplan"][3] / rows["uniform"][3]))
PY
