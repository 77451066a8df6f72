#!/bin/bash
# Lead, seventeenth session: main 6c5bf9a (decode14's mixed instance + decode15's out-of-line buffer tile + the per-chip
# rule) on an H200: gpu_turbo (all), memcheck/racecheck on gpu_turbo_sanitizer_small, and turbo_decode against main
# a005076's, three rounds with the order swapped in round 2, SDPA and the copy ceiling after round 1.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf fbins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v17f
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat FCOMMIT; } | tee $OUT/env.txt
T=$OUT/tests.txt
for tool in; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool gpu_turbo_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done

SH="1 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3 4; do
  if [ $((rep % 2)) = 0 ]; then order="td_new td_main"; else order="td_main td_new"; fi
  for b in $order; do timeout 40 ./$b $SH --only default 2>&1 | sed "s/^/$b$rep /" >> $OUT/decode.txt; done
  [ $rep = 1 ] && timeout 60 python3 $R/scripts/bench_sdpa.py $R/docs/results/h100-2026-11-27-v16/turbo-decode/jobs-decode.json $OUT/sdpa.json 2>&1 | tail -8 > $OUT/sdpa.txt
done
date -u >> $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked" $T; grep -E "mixed" $OUT/decode.txt; cat $OUT/sdpa.txt; ts done
