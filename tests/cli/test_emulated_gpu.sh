#!/usr/bin/env bash
# test_emulated_gpu.sh FFRUN_EMULATED FFRUN FFPLAN — ffrun training on the CUDA backend built
# against the CPU emulation of CUDA (tests/emu: kernels/cuda's own sources, its launchers, cuBLASLt
# calls, device memory and copies), against the CPU backend, as tests/device/run.sh part 2 does
# on a GPU. A one-layer tiny-gqa at sequence 16 (the emulation runs every GPU thread as a fiber),
# 2 steps:
#  * fp32, one rank: per-step losses within 1e-5 of the CPU's;
#  * bf16, one rank: within 1e-4 (the emulated cuBLAS accumulates bf16 products in fp32 as the
#    CPU backend does, in another order);
#  * fp32, two ranks under mpirun splitting heads 3:1, each rank its own emulated GPU: with
#    --comm mpi (TP sums staged through host memory) and with --comm nccl (the NCCL backend on
#    the emulated NCCL, nccl.h: world communicator, splits, sums on device buffers), and two
#    pipelines of batches 3:1 with --comm nccl (gradient sums started on their own stream):
#    each within 1e-5 of the one-rank CPU run;
#  * fp32, a two-layer model in two stages with --comm nccl (activations and their gradients
#    between the stages by NCCL send and receive on device buffers): within 1e-5 of the
#    two-layer model on one CPU rank.
set -u
emulated=$1
ffrun=$2
ffplan=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mpi_yield_when_idle=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

python3 - "$tmp" <<'PY'
import json, sys
def micro(src, dst, precision="fp32", layers=1, batches=None):
    """src at sequence 16, global batch 4 (pipelines' batches `batches` in micro-batches of 1,
    or 4 each in their own size), `layers` split evenly over each pipeline's stages"""
    p = json.load(open(src))
    p["inputs"].pop("digests", None)
    p["inputs"]["model"].update(layers=layers, seq_len=16)
    p["inputs"]["training"].update(global_batch=4, precision=precision)
    for i, pl in enumerate(p["pipelines"]):
        if batches:
            pl.update(batch=batches[i], micro_batch_size=1, micro_batches=batches[i])
        else:
            pl.update(batch=4, micro_batches=4 // pl["micro_batch_size"])
        n = len(pl["stages"])
        for k, st in enumerate(pl["stages"]):
            st["layers"] = [k * layers // n, (k + 1) * layers // n]
    json.dump(p, open(sys.argv[1] + "/" + dst, "w"), indent=1)
micro("tests/plans/one-rank.json", "fp32.json")
micro("tests/plans/one-rank.json", "bf16.json", "bf16")
micro("tests/plans/tp2-heads-3to1.json", "tp2.json")
micro("tests/plans/dp2-batches-3to1.json", "dp2.json", batches=(3, 1))
micro("tests/plans/pp2-layers-3to1.json", "pp2.json", layers=2)
micro("tests/plans/one-rank.json", "two-layers.json", layers=2)
PY

# losses A B TOL: the per-step losses of two metrics files agree to relative TOL
. tests/metrics.sh
losses() {
  local detail rc
  detail=$(losses_compare "$@")
  rc=$?
  echo "  ${2##*/}: $detail"
  return $rc
}

run() { # plan backend metrics [ranks [comm]]
  local n=${4:-1}
  if [ "$n" -gt 1 ]; then # as many emulated GPUs as ranks: NCCL wants one GPU per rank
    FF_EMU_GPUS=$n mpirun -x FF_EMU_GPUS -np "$n" "$emulated" "$tmp/$1.json" --text LICENSE \
      --steps 2 --quiet --backend "$2" --comm "${5:-mpi}" --metrics "$tmp/$3.jsonl" \
      >"$tmp/$3.log" 2>&1
  elif [ "$2" = cpu ]; then
    "$ffrun" "$tmp/$1.json" --text LICENSE --steps 2 --quiet --backend cpu \
      --metrics "$tmp/$3.jsonl" >"$tmp/$3.log" 2>&1
  else
    "$emulated" "$tmp/$1.json" --text LICENSE --steps 2 --backend cuda \
      --metrics "$tmp/$3.jsonl" >"$tmp/$3.log" 2>&1
  fi || { fail "$3: ffrun failed"; tail -5 "$tmp/$3.log"; }
}

run fp32 cpu cpu-fp32
run bf16 cpu cpu-bf16
run two-layers cpu cpu-two-layers
run fp32 cuda emulated-fp32
grep -q "training on the CUDA backend" "$tmp/emulated-fp32.log" ||
  fail "the emulated build did not train on its CUDA backend"
run bf16 cuda emulated-bf16
run tp2 cuda emulated-tp2 2
run tp2 cuda emulated-tp2-nccl 2 nccl
run dp2 cuda emulated-dp2-nccl 2 nccl
run pp2 cuda emulated-pp2-nccl 2 nccl
losses "$tmp/cpu-fp32.jsonl" "$tmp/emulated-fp32.jsonl" 1e-5 || fail "fp32 one rank"
losses "$tmp/cpu-bf16.jsonl" "$tmp/emulated-bf16.jsonl" 1e-4 || fail "bf16 one rank"
losses "$tmp/cpu-fp32.jsonl" "$tmp/emulated-tp2.jsonl" 1e-5 || fail "fp32 two ranks, TP 3:1"
losses "$tmp/cpu-fp32.jsonl" "$tmp/emulated-tp2-nccl.jsonl" 1e-5 || fail "TP 3:1, --comm nccl"
losses "$tmp/cpu-fp32.jsonl" "$tmp/emulated-dp2-nccl.jsonl" 1e-5 || fail "DP 3:1, --comm nccl"
losses "$tmp/cpu-two-layers.jsonl" "$tmp/emulated-pp2-nccl.jsonl" 1e-5 || fail "PP 2, --comm nccl"
[ $failures -eq 0 ] && echo "emulated GPU training: passed" || echo "emulated GPU training: FAILED"
exit $failures
