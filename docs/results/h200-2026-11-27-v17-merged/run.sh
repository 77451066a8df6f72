#!/bin/bash
# Lead, seventeenth session: the merged tree on one GPU: gpu_device_api, gpu_lean (NVRTC test left out), gpu_turbo,
# gpu_turboquant, memcheck/racecheck on the Lean, Lean device-path and TurboAttention small grids; lean_paged once.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"
tar xJf mbins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v17
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat MCOMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
for pair in "gpu_lean gpu_sanitizer_small_grid" "gpu_lean lean_device::gpu_device_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_device_api" >> $T; timeout 100 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "== gpu_lean" >> $T; timeout 150 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "== gpu_turbo" >> $T; timeout 170 ./gpu_turbo --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T


grep -E "==|result|rc=|FAILED|panicked|SKIPPED" $T; ts done
