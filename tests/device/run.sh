#!/usr/bin/env bash
# tests/device/run.sh — the GPU checks of the CUDA backend as one script, for a lent GPU machine
# (one H200; it should take well under 8 minutes). From the repository root:
#   tests/device/fetch-debs.sh          (here, once: the Debian packages the build needs)
#   tests/device/run.sh                 (there, carrying .device-debs)
# It builds with CUDA into build-device/, then
#   1. every kernel against the CPU backend on fresh random inputs (check_kernels fp32, bf16),
#      with the fused fp32 attention kernel (FF_ATTENTION=fused), again with FF_ATTENTION=gemm
#      (cuBLAS attention, the default under bf16 math), and in bf16 with FF_ATTENTION=tensor
#      (the tensor-core kernel; fp32 math uses the fused one);
#   2. 20 training steps of the tiny model on the GPU against the CPU backend, fp32 and bf16,
#      with the default attention and each other one;
#   3. a 4-rank plan (DP + PP + uneven TP with a shared kv head) on the one GPU under mpirun
#      (--comm mpi: NCCL refuses two ranks on one GPU), against the one-rank GPU run of the same
#      model, its validation loss too; and the NCCL backend on one rank (several need several
#      GPUs);
#   4. the ~1B Llama on one GPU, with each attention: tokens/s, MFU against 989 TFLOP/s (printed
#      against the 50 % target), the step split into matmul, attention and the rest; fails when a
#      loss is not finite or the backend's memory is more than 5 % off the prediction less the
#      runtime reserve;
#   5. `ffrun profile --model` the ~1B Llama on the GPU (GEMMs of its shapes and the peak, its
#      layer's forward and backward), a plan on that profile, one run of it, `ffplan
#      calibrate`; fails unless the calibrated profile predicts that run's iteration within 15 %;
# and prints a summary table last (also written to $OUT/summary.md when OUT is set).
# Exit status: the number of failed parts (0 = all passed).
# FF_DEVICE_PARTS="2 4 5" runs only the parts named (the build always; default all);
# FF_DEVICE_ATTENTIONS="gemm" only those attentions in part 4 (default: gemm tensor fused).
#
# FF_DEVICE_REHEARSAL=BUILD_DIR rehearses the script where no GPU answers (the test
# `device-script` does, in CI): the binaries of that existing build, the CPU backend standing in
# for CUDA, check_kernels' self-check once, the tiny model in place of the 1B one, and no NCCL
# part. It checks the script's own plumbing (plans, metrics, the summary), not the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
rehearsal=${FF_DEVICE_REHEARSAL:-}
bdir=${rehearsal:-build-device}
backend=cuda bench_model=tests/device/llama-1b.json
[ -n "$rehearsal" ] && backend=cpu bench_model=profiles/models/tiny.json
out=${OUT:-$bdir/out}
parts=" ${FF_DEVICE_PARTS:-1 2 3 4 5} "
part() { [[ $parts == *" $1 "* ]]; }
mkdir -p "$out"
rows=()
failed=0
say() { echo "[device $(($(date +%s) - t0)) s] $*" >&2; }
row() { # part, result, detail
  rows+=("| $1 | $2 | $3 |")
  [ "$2" = pass ] || [ "$2" = measured ] || [ "$2" = skipped ] || failed=$((failed + 1))
}

# ---- 0. what the machine lacks comes from the carried packages, unpacked into a prefix -------
if [ -d .device-debs ] && ! pkg-config --exists libcjson 2>/dev/null; then
  say "unpacking $(ls .device-debs/*.deb | wc -l) carried packages into /tmp/ffdeps"
  P=/tmp/ffdeps
  for f in .device-debs/*.deb; do dpkg -x "$f" "$P"; done
  L=$P/usr/lib/x86_64-linux-gnu
  export PKG_CONFIG="$P/usr/bin/pkgconf" PKG_CONFIG_SYSROOT_DIR=$P
  export PKG_CONFIG_PATH=$L/pkgconfig:$L/openmpi/lib/pkgconfig:$P/usr/share/pkgconfig
  export CPATH=$P/usr/include:$P/usr/include/x86_64-linux-gnu/openblas-pthread
  export LIBRARY_PATH=$L:$L/openblas-pthread:$L/openmpi/lib
  export LD_LIBRARY_PATH=$L:$L/openblas-pthread:$L/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=$P/usr PATH=$P/usr/bin:$PATH
  ln -sf pkgconf "$P/usr/bin/pkg-config"
  ln -sf mpirun.openmpi "$P/usr/bin/mpirun"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

say "configure and build (CUDA enabled)"
if [ -n "$rehearsal" ]; then
  [ -x "$bdir/executor/ffrun" ] || { echo "run.sh: no build in $bdir" >&2; exit 2; }
  row build skipped "rehearsal: the binaries of $bdir, the CPU backend for CUDA"
elif ! { [ -f build-device/build.ninja ] || meson setup --wipe build-device -Dcuda=enabled \
           -Dbuildtype=release >"$out/build.log" 2>&1 ||
           meson setup build-device -Dcuda=enabled -Dbuildtype=release >"$out/build.log" 2>&1; } ||
     ! ninja -C build-device >>"$out/build.log" 2>&1; then
  tail -30 "$out/build.log"
  row build FAIL "see build.log"
  printf '%s\n' "| part | result | detail |" "|---|---|---|" "${rows[@]}"
  exit 1
else
  row build pass "build-device/ (CUDA backend enabled)"
fi
ffrun=$bdir/executor/ffrun
ffplan=$bdir/planner/ffplan
if [ -n "$rehearsal" ]; then echo "none (rehearsal on the CPU)" >"$out/gpu.txt"; else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
fi

# ---- 1. kernels --------------------------------------------------------------------------------
# (each attention by name; FF_ATTENTION=tensor only in bf16: under fp32 math it is the fused one)
part 1 && for attention in fused gemm tensor; do
  for math in fp32 bf16; do
    [ $attention = tensor ] && [ $math = fp32 ] && continue
    mode=$math
    if [ -n "$rehearsal" ]; then # the self-check, once: no backend to hold the CPU against
      [ $attention$math = fusedfp32 ] || continue
      mode=self
    fi
    say "check_kernels $mode, attention $attention"
    log=$out/kernels-$math-$attention.txt
    # chunks of 32 query rows, so that the checks' short sequences cross chunks
    FF_ATTENTION=$attention FF_TEST_ATTENTION_ROWS=32 "$bdir/tests/check_kernels" "$mode" \
      >"$log" 2>&1
    rc=$?
    worst=$(awk '$0 ~ /rel error/ {for (i = 1; i < NF; i++) if ($i == "error") print $(i + 1)}' \
            "$log" | sort -g | tail -1)
    [ $rc -eq 0 ] && r=pass || r=FAIL
    row "1. kernels ($math, attention $attention)" $r \
      "$(tail -1 "$log"); worst rel error ${worst:-?}"
    grep FAIL "$log" | head -5 >&2
  done
done

# losses_compare A B TOL: the per-step losses of two metrics files agree to relative TOL
. tests/metrics.sh

# ---- 2. training curves ------------------------------------------------------------------------
part 2 && say "20 steps, CPU against GPU"
part 2 && $ffplan plan --cluster tests/device/h200-1.json --model profiles/models/tiny.json \
  --training tests/device/tiny-bf16-training.json -o "$out/tiny-bf16.json" >/dev/null 2>&1
part 2 && for prec in fp32 bf16; do
  plan=tests/plans/one-rank.json tol=1e-4
  [ $prec = bf16 ] && plan=$out/tiny-bf16.json tol=2e-2
  run20=("$ffrun" "$plan" --text LICENSE --steps 20 --quiet)
  "${run20[@]}" --backend cpu --metrics "$out/cpu-$prec.jsonl" &&
    "${run20[@]}" --backend $backend --metrics "$out/gpu-$prec.jsonl" 2>"$out/gpu-$prec.err"
  detail=$(losses_compare "$out/cpu-$prec.jsonl" "$out/gpu-$prec.jsonl" $tol) && r=pass || r=FAIL
  row "2. 20 steps GPU vs CPU ($prec, default attention)" $r "$detail"
  for attention in fused gemm tensor; do
    [ $attention = fused ] && [ $prec = fp32 ] && continue # the default there
    [ $attention = tensor ] && [ $prec = fp32 ] && continue # fused under fp32 math
    [ $attention = gemm ] && [ $prec = bf16 ] && continue   # the default there
    m=$out/gpu-$prec-$attention
    FF_ATTENTION=$attention "${run20[@]}" --backend $backend --metrics "$m.jsonl" 2>"$m.err"
    detail=$(losses_compare "$out/cpu-$prec.jsonl" "$m.jsonl" $tol) && r=pass || r=FAIL
    row "2. 20 steps GPU vs CPU ($prec, attention $attention)" $r "$detail"
  done
done

# ---- 3. a 4-rank plan on the one GPU -----------------------------------------------------------
if part 3; then
say "4 ranks on one GPU under mpirun"
val=(--eval-data README.md --eval-batches 2) # a validation after step 5 (the last)
$ffrun tests/plans/one-rank.json --text LICENSE --steps 5 --quiet --backend $backend "${val[@]}" \
  --metrics "$out/one-gpu.jsonl" 2>"$out/one-gpu.err"
timeout 180 mpirun -np 4 $ffrun tests/device/dp-pp-tp-4rank.json --text LICENSE --steps 5 --quiet \
  --backend $backend "${val[@]}" --metrics "$out/four-gpu.jsonl" >"$out/four-gpu.log" 2>&1
detail=$(losses_compare "$out/one-gpu.jsonl" "$out/four-gpu.jsonl" 1e-4) && r=pass || r=FAIL
row "3. 4-rank DP+PP+uneven TP = 1 rank (GPU)" $r "$detail"

if [ -n "$rehearsal" ]; then
  row "3b. --comm nccl, 1 rank (bootstrap, splits, watchdog)" skipped "rehearsal: NCCL needs a GPU"
else
  say "NCCL on one rank"
  timeout 120 mpirun -np 1 $ffrun tests/plans/one-rank.json --text LICENSE --steps 5 --quiet \
    --backend cuda --comm nccl --metrics "$out/nccl-1.jsonl" >"$out/nccl-1.log" 2>&1
  detail=$(losses_compare "$out/one-gpu.jsonl" "$out/nccl-1.jsonl" 1e-6) && r=pass || r=FAIL
  row "3b. --comm nccl, 1 rank (bootstrap, splits, watchdog)" $r "$detail"
fi
vals=$(for f in one-gpu four-gpu; do [ -s "$out/$f.jsonl" ] && metrics_last "$out/$f.jsonl" val_loss; done)
detail=$(echo $vals | awk '{ d = $1 - $2; d = d < 0 ? -d : d; rel = (NF == 2 && $1 > 0) ? d / $1 : 1
  printf "validation loss %s (1 rank) vs %s (4 ranks), rel %.2e (tolerance 1e-4)", $1, $2, rel
  exit !(NF == 2 && $1 != "null" && rel <= 1e-4) }') && r=pass || r=FAIL
row "3c. validation (--eval-data), 4 ranks = 1 rank (GPU)" $r "$detail"
fi

# ---- 4. the ~1B Llama on one GPU ---------------------------------------------------------------
part 4 && say "llama-1b throughput"
part 4 && $ffplan plan --cluster tests/device/h200-1.json --model "$bench_model" \
  --training tests/device/bench-training.json -o "$out/llama-1b.json" >"$out/llama-1b-plan.txt" 2>&1
part 4 && for attention in ${FF_DEVICE_ATTENTIONS:-gemm tensor fused}; do
  m=$out/llama-1b-$attention
  timeout 300 env FF_ATTENTION=$attention $ffrun "$out/llama-1b.json" --text LICENSE --steps 6 \
    --backend $backend --metrics "$m.jsonl" >"$m.log" 2>&1
  keys=loss,step_seconds,matmul_seconds,attention_seconds,tokens_per_second,mfu,memory_gib
  keys=$keys,predicted_memory_gib,device_used_gib
  detail=$( { [ -s "$m.jsonl" ] && $ffplan metrics "$m.jsonl" --get $keys 2>&1; } |
    python3 -c '
import json, math, statistics, sys
names = sys.argv[3].split(",")
lines = sys.stdin.read().splitlines()
if any(len(l.split("\t")) != len(names) for l in lines) or not lines:
    print("no metrics (see the log beside them): " + " ".join(lines[:2])); sys.exit(1)
value = lambda v: math.nan if v == "null" else float(v)
all_rows = [dict(zip(names, map(value, l.split("\t")))) for l in lines]
rows = all_rows[2:]  # steps 1-2 warm up
if not rows:
    print("no steps measured"); sys.exit(1)
m = json.load(open(sys.argv[1]))
device = json.load(open(sys.argv[2]))["inputs"]["cluster"]["device_types"][0]
reserve = device["runtime_reserve_gib"]
C, L, F, V, S = m["hidden"], m["layers"], m["ffn_hidden"], m["vocab"], m["seq_len"]
D = C // m["heads"]
matmul_params = L * (2 * C * C + 2 * C * m["kv_heads"] * D + 3 * C * F) + V * C
med = lambda k: statistics.median(r[k] for r in rows)
want = rows[-1]["predicted_memory_gib"] - reserve
off = abs(rows[-1]["memory_gib"] - want) / want
problems = [] if all(math.isfinite(r["loss"]) for r in all_rows) else ["a loss is not finite"]
if off > 0.05:
    problems.append("memory %.1f %% off the prediction" % (100 * off))
step, mm, att = med("step_seconds"), med("matmul_seconds"), med("attention_seconds")
tokens = med("tokens_per_second") * step
mm_tflops = 6 * tokens * matmul_params / mm / 1e12 if mm > 0 else 0
print(("; ".join(problems) + ": " if problems else "") +
      "median of %d steps: %.3f s/step, %.0f tokens/s, MFU %.1f %% (989 TFLOP/s; target 50 %%: %s); "
      "split: matmul "
      "%.3f s (%.0f %%, %.0f TFLOP/s = %.0f %% of 989), attention %.3f s (%.0f %%), "
      "the rest %.3f s; "
      "backend memory %.2f GiB against %.2f predicted less the %.2f GiB runtime reserve (%.1f %%); "
      "device %.2f GiB in use against %.2f predicted (activations kept in bf16)"
      % (len(rows), step, med("tokens_per_second"), 100 * med("mfu"),
         "met" if med("mfu") >= 0.5 else "missed", mm, 100 * mm / step,
         mm_tflops, 100 * mm_tflops / 989, att, 100 * att / step, step - mm - att,
         rows[-1]["memory_gib"], want, reserve, 100 * rows[-1]["memory_gib"] / want,
         rows[-1]["device_used_gib"], rows[-1]["predicted_memory_gib"]))
sys.exit(1 if problems else 0)
' "$bench_model" "$out/llama-1b.json" "$keys"
  ) && r=pass || r=FAIL
  row "4. llama-1b, 1 GPU, bf16 matmuls, attention $attention" $r "$detail"
done

# ---- 5. profile the GPU, plan on the profile, calibrate on a run -------------------------------
# (the benchmark model: a tiny one's step is kernel launches, which no profile entry describes)
if part 5; then
say "ffrun profile on the GPU, then calibrate"
log=$out/profile.log
bench_training=tests/device/bench-training.json profile_steps=6
[ -n "$rehearsal" ] && bench_training=tests/device/tiny-bf16-training.json profile_steps=12
$ffrun profile -o "$out/gpu-profile.json" --model "$bench_model" >"$log" 2>&1 &&
  $ffplan validate "$out/gpu-profile.json" >>"$log" 2>&1 &&
  $ffplan plan --cluster "$out/gpu-profile.json" --model "$bench_model" \
    --training $bench_training -o "$out/profiled-plan.json" >>"$log" 2>&1 &&
  timeout 300 mpirun -np 1 $ffrun "$out/profiled-plan.json" --text LICENSE \
    --steps $profile_steps --quiet --backend $backend --metrics "$out/profiled-run.jsonl" \
    >>"$log" 2>&1 &&
  $ffplan calibrate --plan "$out/profiled-plan.json" --metrics "$out/profiled-run.jsonl" \
    --cluster "$out/gpu-profile.json" -o "$out/gpu-calibrated.json" >"$out/calibrate.txt" 2>&1
if [ -s "$out/calibrate.txt" ] && grep -q '^iteration' "$out/calibrate.txt"; then
  peaks=$(python3 - "$out/gpu-profile.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["device_types"][0]
p = d["peak_tflops"]
print("%s: peak bf16 %.4g / fp32 %.4g TFLOP/s measured" % (d["name"], p.get("bf16", 0), p["fp32"]))
PY
  )
  errors=$(awk '/^iteration/ {print $5, $6}' "$out/calibrate.txt")
  after=$(awk '/^iteration/ {gsub("%", "", $6); print ($6 < 0 ? -$6 : $6)}' "$out/calibrate.txt")
  if awk -v a="$after" 'BEGIN { exit !(a <= 15) }'; then r=pass; else r=FAIL; fi
  row "5. profile + calibrate (GPU)" $r "$peaks; iteration error before/after: $errors (after: 15 % at most)"
else
  row "5. profile + calibrate (GPU)" FAIL "see profile.log and calibrate.txt"
fi
fi

# ---- summary -----------------------------------------------------------------------------------
{
  echo "GPU: $(cat "$out/gpu.txt" 2>/dev/null)   total $(($(date +%s) - t0)) s"
  echo
  echo "| part | result | detail |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/summary.md"
exit "$failed"
