#!/bin/bash
# Twelfth session, call 7: the paged-ahead copies from u32 pool rows (one IMAD.WIDE.U32 per K address, V at a fixed
# distance) and a two-word per-unit ring state; gpu_lean (NVRTC included) and both Lean sanitizer grids; lean_paged
# of this tree against 320424c (prev), interleaved twice, then --same-plan once each.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v12g
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
echo "== gpu_lean" >> $T; timeout 200 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
grep -E "==|result|rc=|FAILED|panicked" $T
if grep -qE "FAILED|panicked|rc=[1-9]" $T; then echo "tests failed: no timing"; exit 1; fi
P=$OUT/paged.txt
for v in prev new prev new; do echo "== $v full list (rotated)" >> $P; timeout 60 ./lean_paged_$v >> $P 2>&1; done
for v in prev new; do echo "== $v --same-plan" >> $P; timeout 60 ./lean_paged_$v --same-plan >> $P 2>&1; done
cat $P
