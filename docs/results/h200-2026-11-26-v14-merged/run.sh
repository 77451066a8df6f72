#!/bin/bash
# Lead, fourteenth session: the final merged kernels (ab1f9fc: paged14, prefill9+10, decode11) on one GPU: gpu_turboquant,
# gpu_device_api, gpu_turbo (prefill and decode, NVRTC tests included), memcheck/racecheck on the small TurboQuant and
# TurboAttention grids. No timings.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v14f
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
for t in gpu_turboquant gpu_device_api; do ts "== $t" >> $T; timeout 150 ./$t --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T; done
for pair in "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_turbo" >> $T; timeout 200 ./gpu_turbo --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
grep -E "==|result|rc=|FAILED|panicked" $T; ts done
