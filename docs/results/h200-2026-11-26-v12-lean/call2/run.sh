#!/bin/bash
# Twelfth session, call 2: Lean paged copies from u64 byte offsets (full units without predicates) and plan_paged
# keeping the slot-filling grid where one CTA per SM would hold several whole tiles; gpu_lean, gpu_device_api,
# sanitizers; lean_paged of this tree against 0ca50bd's (prev), full list, interleaved twice.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v12b
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
echo "== gpu_lean" >> $T; timeout 200 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_device_api" >> $T; timeout 90 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
grep -E "==|result|rc=|FAILED|panicked" $T
P=$OUT/paged.txt
for v in prev new prev new; do echo "== $v full list (rotated)" >> $P; timeout 60 ./lean_paged_$v --out $OUT/$v.json >> $P 2>&1; done
cat $P
