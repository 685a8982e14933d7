#!/usr/bin/env bash
# bench_network.sh [BUILD] — stage transfers over slow links: predicted against measured.
#
# Four CPU ranks, each emulating a device 8x slower than one core (--throttle, as in
# bench_hetero.sh: waiting instead of computing keeps the ranks from sharing a core), are
# profiled; then a 4-stage pipeline of the tiny model (one layer per stage, one rank per node)
# trains on three networks: the machine's own (the profile's measured link, no emulation), and
# two links that ffrun --emulate-network makes as slow as the plan says, one whose transfer of a
# micro-batch's activation takes about half a forward, one about twice a forward. Each network
# runs 1F1B and GPipe. The prediction is `ffplan simulate` with overlapped transfers (ffrun's MPI
# path: receives posted ahead, sends that do not hold the sender); beside it, what paired blocking
# exchanges (the NCCL path) would take, and the same predictions after one `ffplan calibrate` on
# the run over the machine's network (1F1B), which fits the compute, not the emulated links.
# FF_NETWORK_STEPS, FF_NETWORK_THROTTLE and FF_NETWORK_OUT change the setting.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
ffplan=$build/planner/ffplan
ffrun=$build/executor/ffrun
out=${FF_NETWORK_OUT:-$(mktemp -d)}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
model=profiles/models/tiny.json
training=profiles/training/tiny.json
steps=${FF_NETWORK_STEPS:-30}
f=${FF_NETWORK_THROTTLE:-8}

echo "== 1. profile: mpirun -np 4 ffrun profile --throttle 0=$f,1=$f,2=$f,3=$f"
mpirun -np 4 "$ffrun" profile -o "$out/profile.json" --model "$model" --throttle "0=$f,1=$f,2=$f,3=$f"

echo "== 2. plans: a 4-stage pipeline, one rank per node, on three networks and two schedules"
python3 - "$out" "$model" "$training" <<'PY'
import copy, json, sys
out, model_file, training_file = sys.argv[1:4]
prof = json.load(open(out + "/profile.json"))
model, training = json.load(open(model_file)), json.load(open(training_file))
dev = prof["device_types"][0]
own = prof["nodes"][0]  # the machine's link between ranks, as the profile measured it
act = model["seq_len"] * model["hidden"] * 4  # bytes of one sequence's activation
fwd_ms = next(l["forward_ms"] for l in dev["measured"]["layers"] if l["micro_batch_size"] == 1)
networks = {
    "own": (own["island_bandwidth_gb_per_s"], own["island_latency_us"]),
    # one micro-batch's activation in about half a forward, and in about two
    "half": (act / (0.5 * fwd_ms * 1e-3) / 1e9, 100.0),
    "twice": (act / (2.0 * fwd_ms * 1e-3) / 1e9, 100.0),
}
P = model["layers"]
for net, (bw, lat) in networks.items():
    for sched in ("1f1b", "gpipe"):
        cluster = {"format": "ff-cluster/1", "name": "network-" + net,
                   "description": "The profiled device, one rank per node, network: " + net,
                   "device_types": [dev],
                   "nodes": [{"name": "n%d" % i, "device": dev["name"], "gpus": 1} for i in range(P)],
                   "network": {"default": {"bandwidth_gb_per_s": round(bw, 6),
                                           "latency_us": round(lat, 3)}}}
        tr = copy.deepcopy(training)
        tr["schedule"] = sched
        stages = []
        for i in range(P):
            rank = {"rank": i, "node": "n%d" % i, "gpu": 0, "device": dev["name"],
                    "heads": [0, model["heads"]], "kv_heads": [0, model["kv_heads"]],
                    "ffn": [0, model["ffn_hidden"]]}
            if i in (0, P - 1):
                rank["vocab"] = [0, model["vocab"]]
            stages.append({"layers": [i, i + 1], "embedding": i == 0, "lm_head": i == P - 1,
                           "recompute": "none", "ranks": [rank]})
        plan = {"format": "ff-plan/1", "name": "pp%d-%s-%s" % (P, net, sched),
                "inputs": {"model": model, "training": tr, "cluster": cluster},
                "pipelines": [{"batch": tr["global_batch"], "micro_batch_size": 1,
                               "micro_batches": tr["global_batch"], "stages": stages}]}
        json.dump(plan, open("%s/%s-%s.json" % (out, net, sched), "w"))
        json.dump(cluster, open("%s/%s-cluster.json" % (out, net), "w"))
        paired = copy.deepcopy(cluster)  # the same devices as GPUs: ffrun's paired NCCL path
        paired["device_types"][0].pop("kind", None)
        json.dump(paired, open("%s/%s-paired.json" % (out, net), "w"))
PY
runs="own-1f1b own-gpipe half-1f1b half-gpipe twice-1f1b twice-gpipe"
for r in $runs; do
  "$ffplan" fmt --in-place "$out/$r.json"
done
"$ffplan" fmt --in-place "$out"/*-cluster.json "$out"/*-paired.json

echo "== 3. train each plan $steps steps"
for r in $runs; do
  emulate=()
  case $r in own-*) ;; *) emulate=(--emulate-network) ;; esac
  mpirun -np 4 "$ffrun" "$out/$r.json" --text LICENSE --steps "$steps" --quiet \
    --metrics "$out/$r.jsonl" "${emulate[@]}"
  "$ffplan" metrics "$out/$r.jsonl" --get step_seconds >"$out/$r.tsv"
done

echo "== 4. calibrate on the run over the machine's network (1F1B); predict every run"
"$ffplan" calibrate --plan "$out/own-1f1b.json" --metrics "$out/own-1f1b.jsonl" \
  --cluster "$out/own-cluster.json" -o "$out/calibrated-own.json" >/dev/null
for net in own half twice; do # the fitted device on each network, links as the plan says
  python3 - "$out" "$net" <<'PY'
import json, sys
out, net = sys.argv[1:3]
fitted = json.load(open(out + "/calibrated-own.json"))["device_types"][0]
for suffix in ("cluster", "paired"):
    c = json.load(open("%s/%s-%s.json" % (out, net, suffix)))
    if suffix == "paired":
        fitted = dict(fitted)
        fitted.pop("kind", None)
    c["device_types"] = [fitted]
    json.dump(c, open("%s/%s-%s-fitted.json" % (out, net, suffix), "w"))
PY
done
for r in $runs; do
  net=${r%%-*}
  "$ffplan" simulate "$out/$r.json" --json >"$out/$r-pred.json"
  "$ffplan" simulate "$out/$r.json" --cluster "$out/$net-paired.json" --json >"$out/$r-paired.json"
  "$ffplan" simulate "$out/$r.json" --cluster "$out/$net-cluster-fitted.json" --json \
    >"$out/$r-fitted.json"
  "$ffplan" simulate "$out/$r.json" --cluster "$out/$net-paired-fitted.json" --json \
    >"$out/$r-paired-fitted.json"
done
python3 - "$out" $runs <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], sys.argv[2:]
def pred(r, kind):
    return json.load(open("%s/%s-%s.json" % (out, r, kind)))["iteration_seconds"]
print()
print("| network | schedule | link GB/s | measured s/step | predicted (profile) | error |"
      " paired would be | predicted (calibrated) | error | paired would be |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in runs:
    net, sched = r.split("-")
    bw = json.load(open("%s/%s.json" % (out, r)))["inputs"]["cluster"]["network"]["default"][
        "bandwidth_gb_per_s"]
    steps = [float(l) for l in open("%s/%s.tsv" % (out, r))][2:]
    m = statistics.median(steps)
    p, q = pred(r, "pred"), pred(r, "fitted")
    print("| %s | %s | %.4g | %.4f | %.4f | %+.1f %% | %.4f | %.4f | %+.1f %% | %.4f |" % (
        {"own": "this machine's", "half": "emulated, ½ forward",
         "twice": "emulated, 2 forwards"}[net], sched, bw, m, p, 100 * (p - m) / m,
        pred(r, "paired"), q, 100 * (q - m) / m, pred(r, "paired-fitted")))
PY
