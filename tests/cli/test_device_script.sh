#!/usr/bin/env bash
# test_device_script.sh BUILD_DIR — rehearses tests/device/run.sh on the CPU (FF_DEVICE_REHEARSAL),
# so that the GPU script, which runs only where a GPU is lent, does not rot between loans: every
# part must run, write its metrics and pass, and the summary must list each part.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1
FF_DEVICE_REHEARSAL=$1 OUT=$tmp tests/device/run.sh >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
cat "$tmp/stdout"
fail=0
[ $rc -eq 0 ] || { echo "FAIL: run.sh exited $rc"; tail -20 "$tmp/stderr"; fail=1; }
# build, 1 kernel check, 5 training curves, 4 ranks, NCCL, validation, 3 benchmark runs, profile
rows=$(grep -c '^| [0-9b]' "$tmp/summary.md" 2>/dev/null)
[ "${rows:-0}" -eq 14 ] || { echo "FAIL: the summary has ${rows:-no} parts, not 14"; fail=1; }
for part in "1. kernels" "2. 20 steps" "3. 4-rank" "3b. --comm nccl" "3c. validation" "4. llama-1b" \
  "5. profile"; do
  grep -q "^| $part" "$tmp/summary.md" 2>/dev/null || { echo "FAIL: no part '$part'"; fail=1; }
done
grep -q 'MFU [0-9.]* %' "$tmp/summary.md" 2>/dev/null || { echo "FAIL: no MFU figure"; fail=1; }
[ $fail -eq 0 ] && echo "device script rehearsal: passed" || echo "device script rehearsal: FAILED"
exit $fail
