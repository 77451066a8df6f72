#!/bin/bash
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
{ date; nvidia-smi --query-gpu=name,driver_version,clocks.mem --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
timeout 150 ./gpu_lean --include-ignored --test-threads=1 --skip gpu_nvrtc_path 2>&1 | grep -E "^test |test result|panicked|SKIPPED|assert" >> $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
cat $OUT/env.txt; cat $T | grep -E "result|rc=|FAILED|panicked"
P=$OUT/paged.txt
for r in old new old new; do echo "== $r" >> $P; timeout 100 ./lean_paged_$r --quick >> $P 2>&1; done
echo "== full old" >> $P; timeout 150 ./lean_paged_old >> $P 2>&1
echo "== full new" >> $P; timeout 150 ./lean_paged_new >> $P 2>&1
echo "== quick newsame" >> $P; timeout 150 ./lean_paged_new --quick --same-plan >> $P 2>&1
cat $P
timeout 200 ./gpu_lean gpu_nvrtc_path --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked" >> $T; tail -2 $T
