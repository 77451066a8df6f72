#!/bin/bash
# Lead, eighteenth session: the merged tree (prefill14's one-SHF shift + compress11) on one GPU: gpu_turboquant, gpu_turbo
# (all, --include-ignored), memcheck/racecheck on the TurboQuant and TurboAttention small grids, turboquant_compress twice.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf v18.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v18
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
T=$OUT/tests.txt
for pair in "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_turboquant" >> $T; timeout 200 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "== gpu_turbo" >> $T; timeout 200 ./gpu_turbo --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
for r in 1 2; do timeout 60 ./turboquant_compress --only fast,split > $OUT/compress_$r.txt 2>&1; echo "$(ts) compress $r rc=$?" >> $T; done
date -u >> $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked" $T; head -30 $OUT/compress_1.txt; ts done
