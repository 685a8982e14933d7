#!/usr/bin/env bash
# test_reliability.sh FFRUN — failure made boring (docs/reliability.md):
#  * SIGTERM or SIGINT stops a run at the next step boundary with a final checkpoint and exit
#    status 128 + signal; under mpirun, a signal to any one rank stops every rank that way;
#  * a checkpoint that cannot be written (a file-size limit standing in for a full disk) fails
#    that save with a clear error and leaves the previous checkpoints intact, on one rank and
#    under mpirun (where rank 0 writes what the others send); --on-save-error
#    continue goes on;
#  * a non-finite gradient is reported on its step with rank, stage and tensor; --on-nan stop
#    stops, --on-nan skip skips the step;
#  * a truncated or damaged checkpoint is refused with the file and offset, and --resume falls
#    back to the newest intact one;
#  * the one-rank trainer runs clean under valgrind (when valgrind is installed).
set -u
ffrun=$1   # $2: "sanitized" when ffrun is built with ASan (valgrind is then skipped)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
plan=profiles/plans/tiny-1rank.json
train() { "$ffrun" "$plan" --text LICENSE --quiet "$@"; }
train_verbose() { "$ffrun" "$plan" --text LICENSE "$@"; }

# Signals, one rank.
for sig in TERM INT; do
  checks=$((checks + 3))
  "$ffrun" "$plan" --text LICENSE --quiet --steps 1000000 --checkpoint-dir "$tmp/sig$sig" \
    --checkpoint-every 1000000 >"$tmp/log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do ls "$tmp/sig$sig"/step-00000000.safetensors >/dev/null 2>&1 && break; sleep 0.1; done
  sleep 0.5
  kill -"$sig" "$pid"
  wait "$pid"
  status=$?
  want=$((128 + $(kill -l "$sig")))
  [ "$status" = "$want" ] || fail "SIG$sig: exit status $status, expected $want"
  grep -q "stopped by SIG$sig after step [0-9]* with a final checkpoint" "$tmp/log" || fail "SIG$sig: no message"
  [ "$(ls "$tmp/sig$sig" | wc -l)" = 2 ] || fail "SIG$sig: no final checkpoint"
done
checks=$((checks + 1))
python3 - "$ffrun" "$plan" <<'PY' || fail "a second signal does not stop at once"
import signal, subprocess, sys, time
p = subprocess.Popen([sys.argv[1], sys.argv[2], "--text", "LICENSE", "--quiet", "--steps", "1000000"])
time.sleep(1.0)
p.send_signal(signal.SIGTERM)
p.send_signal(signal.SIGTERM)
try:
    sys.exit(0 if p.wait(timeout=10) == 128 + signal.SIGTERM else 1)
except subprocess.TimeoutExpired:
    p.kill()
    sys.exit(1)
PY

# Signals under mpirun: SIGTERM to one rank stops them all with a checkpoint.
checks=$((checks + 2))
mpirun -np 4 "$ffrun" tests/plans/tp4-gqa.json --text LICENSE --steps 1000000 --quiet \
  --checkpoint-dir "$tmp/mpisig" --checkpoint-every 1000000 >"$tmp/mpi.log" 2>&1 &
job=$!
for _ in $(seq 100); do ls "$tmp/mpisig"/step-00000000.safetensors >/dev/null 2>&1 && break; sleep 0.1; done
sleep 1
kill -TERM "$(pgrep -f "ffrun tests/plans/tp4-gqa.json" | tail -1)"
wait "$job"
[ $? = 143 ] || fail "mpirun: a signal to one rank did not stop the job with status 143"
[ "$(ls "$tmp/mpisig" | wc -l)" = 2 ] || fail "mpirun: no final checkpoint after a signal"

# A checkpoint that cannot be written.
train --steps 2 --checkpoint-dir "$tmp/disk" --checkpoint-every 1 || fail "the run before the full disk"
cp -r "$tmp/disk" "$tmp/disk-before"
checks=$((checks + 4))
(ulimit -f 100; train --steps 4 --checkpoint-dir "$tmp/disk" --checkpoint-every 1 --resume) >"$tmp/log" 2>&1
[ $? = 1 ] || fail "a failed save did not stop the run with status 1"
grep -q "cannot write .*step-00000003.safetensors: File too large (nothing was changed)" "$tmp/log" ||
  fail "a failed save is not explained"
diff -r "$tmp/disk" "$tmp/disk-before" >/dev/null || fail "a failed save changed the checkpoints"
(ulimit -f 100; train --steps 4 --checkpoint-dir "$tmp/disk" --checkpoint-every 1 --resume \
  --on-save-error continue) >"$tmp/log" 2>&1 || fail "--on-save-error continue did not finish the run"
checks=$((checks + 1))
train_verbose --steps 3 --checkpoint-dir "$tmp/disk" --resume >"$tmp/log" 2>&1 && grep -q "resumed from .*step-00000002" "$tmp/log" ||
  fail "the checkpoints before the failed saves do not load"

# Under mpirun rank 0 writes what the others send it: when it cannot, it still takes every piece
# (nobody is left waiting), and the job ends with the error and no file, temporary or not. The
# limit is rank 0's alone, and the ranks talk over TCP: Open MPI's shared-memory files would
# outgrow it.
checks=$((checks + 3))
OMPI_MCA_btl=self,tcp timeout 120 mpirun -np 4 \
  sh -c '[ "$OMPI_COMM_WORLD_RANK" != 0 ] || ulimit -f 100; exec "$@"' sh \
  "$ffrun" tests/plans/tp4-gqa.json --text LICENSE --quiet --steps 2 \
  --checkpoint-dir "$tmp/mpidisk" >"$tmp/log" 2>&1
status=$?
[ $status != 0 ] && [ $status != 124 ] || fail "mpirun: a failed save did not end the job (status $status)"
grep -q "cannot write .*step-00000000.safetensors: File too large (nothing was changed)" "$tmp/log" ||
  fail "mpirun: a failed save is not explained"
[ -z "$(ls -A "$tmp/mpidisk")" ] || fail "mpirun: a failed save left files: $(ls "$tmp/mpidisk")"

# A checkpoint directory that is missing is created; one that cannot be is refused up front.
checks=$((checks + 3))
train --steps 1 --checkpoint-dir "$tmp/new/nested/dir" || fail "a missing checkpoint directory"
[ -e "$tmp/new/nested/dir/step-00000001.safetensors" ] || fail "the missing directory was not created"
train --steps 1 --checkpoint-dir LICENSE/ckpt >"$tmp/log" 2>&1
[ $? = 2 ] && grep -q "checkpoint-dir LICENSE/ckpt: cannot create it: Not a directory" "$tmp/log" ||
  fail "a checkpoint directory that cannot exist is not refused with exit status 2"

# Non-finite gradients.
checks=$((checks + 4))
FF_INJECT_NAN_STEP=3 train --steps 5 >"$tmp/log" 2>&1
[ $? = 1 ] || fail "--on-nan stop did not stop"
grep -q "step 3: the gradient of lm_head is not finite on rank 0 (pipeline 0, stage 0)" "$tmp/log" &&
  grep -q "step 3: a gradient is not finite; stopping (--on-nan stop)" "$tmp/log" ||
  fail "a non-finite gradient is not reported with its step, rank, stage and tensor"
FF_INJECT_NAN_STEP=3 train --steps 5 --on-nan skip --metrics "$tmp/nan.jsonl" >"$tmp/log" 2>&1 || fail "--on-nan skip"
[ "$(wc -l <"$tmp/nan.jsonl")" = 5 ] || fail "--on-nan skip did not go on"
checks=$((checks + 1)) # the same on memory the host cannot read (a GPU's path, on the CPU)
FF_TEST_STAGED_CPU=1 FF_INJECT_NAN_STEP=3 train --steps 5 >"$tmp/log" 2>&1
grep -q "step 3: the gradient of lm_head is not finite on rank 0 (pipeline 0, stage 0)" "$tmp/log" &&
  grep -q "step 3: a gradient is not finite; stopping (--on-nan stop)" "$tmp/log" ||
  fail "a non-finite gradient in backend memory is not found and named"

checks=$((checks + 1))
FF_INJECT_NAN_STEP=3 train --steps 3 --on-nan skip --checkpoint-dir "$tmp/nanskip" >/dev/null 2>&1
[ -e "$tmp/nanskip/step-00000003.safetensors" ] || fail "a skipped last step lost the final checkpoint"
checks=$((checks + 2))
FF_INJECT_NAN_STEP=2 mpirun -np 8 "$ffrun" tests/plans/pp4-tp-1-2-4-1.json --text LICENSE --steps 3 \
  --quiet >"$tmp/mpinan.log" 2>&1 && fail "mpirun: a non-finite gradient did not stop the job"
grep -q "step 2: the gradient of .* is not finite on rank [0-9] (pipeline 0, stage [0-9])" "$tmp/mpinan.log" ||
  fail "mpirun: a non-finite gradient is not reported with its rank, stage and tensor"
# The same where the gradient sums run in place on backend memory (the NCCL path's order: each
# bucket is checked before its sum starts, so the rank that made the NaN is the one named).
checks=$((checks + 1))
FF_TEST_STAGED_CPU=1 FF_TEST_DEVICE_COMM=1 FF_INJECT_NAN_STEP=2 mpirun -np 2 "$ffrun" \
  tests/plans/pp2-layers-3to1.json --text LICENSE --steps 3 --quiet >"$tmp/devnan.log" 2>&1 &&
  fail "device comm: a non-finite gradient did not stop the job"
grep -q "step 2: the gradient of lm_head is not finite on rank 1 (pipeline 0, stage 1)" "$tmp/devnan.log" &&
  grep -q "step 2: the gradient of layers.[0-9]*.w_down is not finite on rank 0 (pipeline 0, stage 0)" \
    "$tmp/devnan.log" || { fail "device comm: the non-finite gradients are not named"; cat "$tmp/devnan.log"; }

# Damaged checkpoints.
train --steps 3 --checkpoint-dir "$tmp/dmg" --checkpoint-every 1 || fail "the run before the damage"
newest=$tmp/dmg/step-00000003.safetensors
size=$(stat -c %s "$newest")
truncate -s $((size - 100)) "$newest"
checks=$((checks + 2))
train_verbose --steps 4 --checkpoint-dir "$tmp/dmg" --resume >"$tmp/log" 2>&1 || fail "resume after a truncated checkpoint"
grep -q "step-00000003.safetensors: byte [0-9]*: the file ends after .* (truncated)" "$tmp/log" ||
  fail "a truncated checkpoint is not refused with its offset"
grep -q "resumed from .*step-00000002" "$tmp/log" || fail "resume did not fall back to the intact checkpoint"
python3 - "$tmp/dmg/step-00000004.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-10] ^= 0xFF
open(p, "wb").write(b)
PY
checks=$((checks + 1))
train --steps 5 --checkpoint-dir "$tmp/dmg" --resume >"$tmp/log" 2>&1
grep -q "step-00000004.safetensors: bytes [0-9]* to [0-9]*: checksum mismatch" "$tmp/log" ||
  fail "a damaged checkpoint is not refused with its offset"

# valgrind, once
if command -v valgrind >/dev/null && [ "${2:-}" != sanitized ]; then
  checks=$((checks + 1))
  FF_BLAS_CORE=keep valgrind -q --error-exitcode=9 --leak-check=full \
    --suppressions="$(dirname "$0")/valgrind.supp" "$ffrun" "$plan" --text LICENSE --quiet --steps 2 \
    >"$tmp/vg.log" 2>&1 || { fail "valgrind reports errors"; tail -20 "$tmp/vg.log"; }
fi

echo "reliability: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
