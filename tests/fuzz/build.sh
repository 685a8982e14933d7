#!/usr/bin/env bash
# build.sh [OUT [TARGET...]] — build the libFuzzer harnesses (all, or the TARGETs named) with clang (ASan + UBSan + libFuzzer) into OUT
# (default build-fuzz/), one binary per target: fuzz_device, fuzz_cluster, fuzz_model,
# fuzz_training, fuzz_plan, fuzz_tokens, fuzz_checkpoint, fuzz_check, fuzz_diff, fuzz_metrics,
# fuzz_calibrate, fuzz_safetensors.
# Run one for 10 minutes on its corpus:
#   build-fuzz/fuzz_plan -max_total_time=600 -timeout=10 tests/fuzz/corpus/plan </dev/null
# (add -close_fd_mask=2 for fuzz_diff and fuzz_calibrate, whose messages would flood the log)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-fuzz}
only=("${@:2}")
mkdir -p "$out"
common=(common/ff_diag.c common/ff_json.c common/ff_format.c common/ff_device.c common/ff_cluster.c
        common/ff_model.c common/ff_plan.c common/ff_summary.c common/ff_metrics.c cost/ff_cost.c cost/ff_sim.c cost/ff_eval.c)
planner=(planner/search.c planner/units.c planner/split.c planner/refine.c planner/graph.c
         planner/partition.c planner/milp.c planner/cmd_simulate.c planner/cmd_plan.c planner/cmd_show.c
         planner/cmd_diff.c planner/cmd_svg.c planner/cmd_svg_timeline.c planner/cmd_hostfile.c planner/cmd_calibrate.c)
executor=(executor/model.c executor/model_layers.c executor/data.c executor/checkpoint.c executor/hf_init.c
          executor/train.c executor/signals.c
          kernels/cpu/ff_kernels_cpu.c kernels/ff_attention_widened.c)
flags=(-std=c17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
       -D_DEFAULT_SOURCE -Icommon -Icost -Iplanner -Iexecutor -Ikernels -Wno-unknown-warning-option)
targets=(device:1 cluster:2 model:3 training:4 plan:5 tokens:6 checkpoint:7 check:8 diff:9 metrics:10
         calibrate:11 safetensors:12)
for t in "${targets[@]}"; do
  name=${t%%:*}
  id=${t##*:}
  if ((${#only[@]})) && [[ " ${only[*]} " != *" $name "* ]]; then
    continue
  fi
  extra=()
  case $name in
    tokens|checkpoint|safetensors) extra=("${executor[@]}" -lopenblas) ;;
    diff|calibrate) extra=("${planner[@]}" -lglpk -lmetis) ;;
  esac
  clang "${flags[@]}" -DFF_FUZZ_TARGET="$id" tests/fuzz/fuzz_targets.c "${common[@]}" "${extra[@]}" \
    -lcjson -lm -o "$out/fuzz_$name"
done
echo "built: $(ls "$out" | tr '\n' ' ')"
