#!/bin/bash
# Fourteenth session, call 1: branch issue-9-paged14 (paged instances with the page words in registers, the default)
# against main dcc6bd1's lean_paged, interleaved twice over the full list (rotated sets, each storage at its planner's
# grid), the branch's old path (--paged grid) once; gpu_device_api, memcheck and racecheck on both small Lean grids,
# gpu_lean without and then with its NVRTC test (last, in whatever time is left).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p14
LIMIT=${LIMIT:-172}
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in main new main new; do ts "$v full list" >> $P; timeout 30 ./lean_paged_$v --out /tmp/$v.json >> $P 2>&1; echo "rc=$?" >> $P; cp /tmp/$v.json $OUT/$v.json 2>/dev/null; done
ts "new --paged grid (the old instances in the branch's binary)" >> $P; timeout 30 ./lean_paged_new --paged grid >> $P 2>&1
grep -v '^$' $P
T=$OUT/tests.txt
ts "gpu_device_api" >> $T; timeout 40 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in lean_device::gpu_device_sanitizer_small gpu_sanitizer_small_grid; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done; done
ts "gpu_lean (all but NVRTC)" >> $T; timeout 60 ./gpu_lean --include-ignored --test-threads=1 --skip gpu_nvrtc_path_matches_golden 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
LEFT=$(( LIMIT - ($(date +%s) - S) ))
ts "gpu_lean NVRTC test (timeout ${LEFT}s)" >> $T
timeout $LEFT ./gpu_lean --include-ignored --test-threads=1 gpu_nvrtc_path_matches_golden --exact 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|NVRTC" >> $T; echo "rc=$?" >> $T
cat $T; ts done
