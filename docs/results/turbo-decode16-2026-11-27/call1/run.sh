#!/bin/bash
# issue-11-decode16 (helper): the mixed decode instance reading its query rows from a pre-pass
# (turbo_decode_quant_q_*). memcheck/racecheck on gpu_turbo_sanitizer_small, gpu_turbo decode,
# gpu_device_api's two turbo-cache tests, then turbo_decode of main 1a4e7dc (td_main) and of the
# branch (td_new) interleaved four rounds (order swapped every round), SDPA + copy ceiling after round 1.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf fbins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d16
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat FCOMMIT; } | tee $OUT/env.txt
T=$OUT/tests.txt
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool gpu_turbo_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
  tail -5 /tmp/san.txt > $OUT/san-$tool.txt
done
ts "== gpu_turbo decode" >> $T; timeout 60 ./gpu_turbo decode --include-ignored --test-threads=1 > /tmp/gt.txt 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|assert|SKIPPED|steps equal" /tmp/gt.txt >> $T
ts "== gpu_device_api gpu_turbo_cache" >> $T; timeout 30 ./gpu_device_api gpu_turbo_cache --include-ignored --test-threads=1 > /tmp/gd.txt 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|assert|SKIPPED" /tmp/gd.txt >> $T
ts "== bench" >> $T
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3 4; do
  if [ $((rep % 2)) = 0 ]; then order="td_new td_main"; else order="td_main td_new"; fi
  for b in $order; do timeout 25 ./$b $SH --only default 2>&1 | sed "s/^/$b$rep /" >> $OUT/decode.txt; done
  [ $rep = 1 ] && timeout 40 python3 $R/scripts/bench_sdpa.py $R/docs/results/h100-2026-11-27-v16/turbo-decode/jobs-decode.json $OUT/sdpa.json 2>&1 | tail -8 > $OUT/sdpa.txt
done
ts "bench done" >> $T
date -u >> $OUT/env.txt; cat $T; grep -E "mixed" $OUT/decode.txt; cat $OUT/sdpa.txt; ts done
