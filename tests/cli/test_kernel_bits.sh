#!/usr/bin/env bash
# test_kernel_bits.sh CLONED ONE_ISA — the CPU kernels give the same bits in every vector width:
# kernel_bits built with the SSE2/AVX2/AVX-512 clones (the widest this CPU has runs) and built
# for SSE2 alone must print the same hash of the same kernels' outputs.
set -euo pipefail
cloned=$("$1") || { echo "FAIL: $1 exited $?"; exit 1; }
one=$("$2") || { echo "FAIL: $2 exited $?"; exit 1; }
isa=$(grep -o -m1 -w 'avx512f\|avx2' /proc/cpuinfo 2>/dev/null | sort -u | tr '\n' ' ' || true)
echo "cloned build: $cloned (this CPU: ${isa:-neither AVX2 nor AVX-512F}); SSE2 build: $one"
if [ "$cloned" != "$one" ]; then
  echo "FAIL: the kernels' bits depend on the vector width"
  exit 1
fi
echo "ok: the same bits"
