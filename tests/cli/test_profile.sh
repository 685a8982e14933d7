#!/usr/bin/env bash
# test_profile.sh FFPLAN FFRUN — measuring and fitting cluster profiles:
#  * `ffrun profile` on 2 and 4 CPU ranks writes a valid cluster whose compute and link figures
#    are positive and plausible; ranks throttled alike become a virtual node of their own device
#    type; a second profile has the same device types and nodes (its timings differ from run to
#    run and are not compared: bench/bench_hetero.sh measures them);
#  * `ffplan calibrate` on metrics synthesised from a cluster with known factors (compute 2x
#    slower, links 3x slower, 0.5 GiB more memory held) recovers those factors.
set -u
ffplan=$1
ffrun=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for n in 2 4; do
  for run in 1 2; do
    checks=$((checks + 1))
    mpirun -np "$n" "$ffrun" profile -o "$tmp/p$n-$run.json" --model profiles/models/tiny.json \
      --throttle "$((n - 1))=3" --quiet >"$tmp/log" 2>&1 || { fail "profile on $n ranks"; cat "$tmp/log"; }
    checks=$((checks + 1))
    "$ffplan" validate "$tmp/p$n-$run.json" >/dev/null || fail "profile on $n ranks is not a valid cluster"
  done
  checks=$((checks + 1))
  python3 - "$tmp/p$n-1.json" "$tmp/p$n-2.json" "$n" <<'PY' || fail "profiles on $n ranks are implausible or disagree"
import json, sys
a, b, n = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
ok = True
def check(cond, what):
    global ok
    if not cond:
        print("  " + what); ok = False
for c in (a, b):
    check(sum(x["gpus"] for x in c["nodes"]) == n, "ranks become GPUs")
    check(len(c["device_types"]) == 2, "the throttled rank has a device type of its own")
    slow = [d for d in c["device_types"] if d.get("emulated_slowdown") == 3]
    check(len(slow) == 1, "emulated_slowdown 3 recorded")
    for d in c["device_types"]:
        check(1e-5 < d["peak_tflops"]["fp32"] < 10, "a CPU core's GEMM TFLOP/s is plausible")
        check(0.05 < d["memory_bandwidth_gb_per_s"] < 1000, "memory bandwidth is plausible")
        check(all(l["forward_ms"] > 0 and l["backward_ms"] > 0 for l in d["measured"]["layers"]), "layer times")
    check(c["network"]["default"]["bandwidth_gb_per_s"] > 0, "the link between the nodes")
# Timings are not compared between the runs (tests assert no wall-clock figures); the structure is.
check([d["name"] for d in a["device_types"]] == [d["name"] for d in b["device_types"]],
      "both runs name the same device types")
check([x["gpus"] for x in a["nodes"]] == [x["gpus"] for x in b["nodes"]], "both runs find the same nodes")
sys.exit(0 if ok else 1)
PY
done

# calibrate recovers known factors
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
plan = json.load(open("profiles/plans/tiny-asym.json"))
cluster = plan["inputs"]["cluster"]
json.dump(dict(cluster, format="ff-cluster/1"), open(d + "/base.json", "w"))
slow = json.loads(json.dumps(cluster))
for dev in slow["device_types"]:
    for k in dev["peak_tflops"]:
        dev["peak_tflops"][k] /= 2
    dev["memory_bandwidth_gb_per_s"] /= 2
for node in slow["nodes"]:
    if "island_bandwidth_gb_per_s" in node:
        node["island_bandwidth_gb_per_s"] /= 3
        node["island_latency_us"] *= 3
plan["inputs"]["cluster"] = slow
del plan["inputs"]["digests"]
json.dump(plan, open(d + "/slow-plan.json", "w"))
PY
"$ffplan" simulate --json "$tmp/slow-plan.json" >"$tmp/sim.json" || fail "simulate the slowed plan"
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
sim = json.load(open(d + "/sim.json"))
plan = json.load(open("profiles/plans/tiny-asym.json"))
stages = []
for p, pe in zip(plan["pipelines"], sim["pipelines"]):
    mb = p["micro_batches"]
    for se in pe["stages"]:
        r = se["ranks"][0]
        stages.append({"compute_seconds": mb * (r["forward_seconds"] + r["backward_seconds"] - r["tp_seconds"]),
                       "tp_seconds": mb * r["tp_seconds"],
                       "p2p_seconds": mb * (se["send_forward_seconds"] + se["send_backward_seconds"]
                                            + se["gather_forward_seconds"] + se["gather_backward_seconds"]),
                       "dp_seconds": se["dp_seconds"], "bubble_seconds": 0,
                       # the ranks held 0.5 GiB more than the slowed cluster predicts
                       "memory_gib": r["memory_gib"]["total"] + 0.5})
with open(d + "/metrics.jsonl", "w") as f:
    for step in (1, 2):
        f.write(json.dumps({"step": step, "step_seconds": sim["iteration_seconds"], "stages": stages}) + "\n")
PY
checks=$((checks + 1))
"$ffplan" calibrate --plan profiles/plans/tiny-asym.json --metrics "$tmp/metrics.jsonl" \
  --cluster "$tmp/base.json" -o "$tmp/fitted.json" >"$tmp/cal.txt" || { fail "calibrate"; cat "$tmp/cal.txt"; }
checks=$((checks + 1))
grep -q "compute x2.000" "$tmp/cal.txt" || { fail "calibrate did not recover the compute factor 2"; cat "$tmp/cal.txt"; }
checks=$((checks + 1))
grep -q "communication x3.000" "$tmp/cal.txt" || { fail "calibrate did not recover the link factor 3"; cat "$tmp/cal.txt"; }
checks=$((checks + 1))
python3 - "$tmp/cal.txt" "$tmp/base.json" <<'PY' || { fail "calibrate did not move the runtime reserve by 0.5 GiB"; cat "$tmp/cal.txt"; }
import json, re, sys
base = json.load(open(sys.argv[2]))["device_types"][0]["runtime_reserve_gib"]
moves = re.findall(r"runtime reserve ([0-9.]+) -> ([0-9.]+) GiB", open(sys.argv[1]).read())
sys.exit(0 if moves and all(abs(float(b) - float(a) - 0.5) < 2e-3 and abs(float(a) - base) < 1e-9
                            for a, b in moves) else 1)
PY
checks=$((checks + 1))
python3 - "$tmp" <<'PY' || fail "the fitted cluster is not the slowed one"
import json, sys
d = sys.argv[1]
f = json.load(open(d + "/fitted.json"))
b = json.load(open(d + "/base.json"))
dev, base = f["device_types"][0], b["device_types"][0]
ok = abs(dev["peak_tflops"]["fp32"] / base["peak_tflops"]["fp32"] - 0.5) < 1e-6
ok &= abs(f["nodes"][0]["island_bandwidth_gb_per_s"] / b["nodes"][0]["island_bandwidth_gb_per_s"] - 1 / 3) < 1e-6
sys.exit(0 if ok else 1)
PY

# calibrate reads metrics strictly (common/ff_metrics.c): a line without step_seconds, a stage
# term that is not a number >= 0, or a key ffrun never writes is refused with FILE:LINE, the JSON
# path and exit status 2, and no output file
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(d + "/metrics.jsonl")]
a = [dict(l) for l in lines]
del a[1]["step_seconds"]
open(d + "/no-step.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in a))
b = json.loads(json.dumps(lines))
b[0]["stages"][1]["compute_seconds"] = "fast"
open(d + "/bad-term.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in b))
c = json.loads(json.dumps(lines))
c[1]["stages"][0]["compute_secs"] = 1
open(d + "/typo.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in c))
e = json.loads(json.dumps(lines))
e[0]["stages"][0]["dp_seconds"] = -1
open(d + "/negative.jsonl", "w").write("".join(json.dumps(l) + "\n" for l in e))
PY
for case in 'no-step:2: (top level): missing required key "step_seconds"' \
            'bad-term:1: stages[1].compute_seconds: expected a number, got a string "fast"' \
            'typo:2: stages[0].compute_secs: unknown key "compute_secs"' \
            'negative:1: stages[0].dp_seconds: '; do
  name=${case%%:*}
  want=${case#*:}
  checks=$((checks + 1))
  "$ffplan" calibrate --plan profiles/plans/tiny-asym.json --metrics "$tmp/$name.jsonl" \
    --cluster "$tmp/base.json" -o "$tmp/never.json" >"$tmp/out" 2>"$tmp/err"
  status=$?
  if [ "$status" != 2 ] || ! grep -qF -- "$tmp/$name.jsonl:$want" "$tmp/err" || [ -e "$tmp/never.json" ]; then
    fail "calibrate on $name metrics: status $status (expected 2, no output file), stderr:"
    sed 's/^/    /' "$tmp/err"
  fi
done

echo "profile: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
