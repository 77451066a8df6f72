#!/bin/bash
# Lean paged: page words read AH=4 units ahead (new) against 2 (old, main 6b7cef6's kernels); tests, sanitizers, lean_paged.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-lp
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
timeout 200 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" > $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
cat $T | grep -E "result|rc=|FAILED|panicked"
P=$OUT/paged.txt
for r in 1 2; do for v in old new; do echo "== $v run $r (quick, rotated)" >> $P; timeout 60 ./lean_paged_$v --quick >> $P 2>&1; done; done
for v in old new; do echo "== $v --same-plan (quick, rotated)" >> $P; timeout 60 ./lean_paged_$v --quick --same-plan >> $P 2>&1; done
cat $P
