#!/bin/bash
# issue-11-decode19 call 3 (helper): the tip 4174dca (automatic schedule = the balanced cut, 8 tiles a unit at 4 x 16k).
# memcheck/racecheck on gpu_turbo_sanitizer_small, gpu_turbo decode, then turbo_decode --only default of main
# (td_main, /work/base-bins19) and the tip (td_new) interleaved four rounds (order swapped every round), SDPA after round 1.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins3.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d19
mkdir -p $FERRATTN_CACHE_DIR $OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "td_main: main 3a6d195 (/work/base-bins19); td_new, gpu_turbo: issue-11-decode19 4174dca"; } | tee $OUT/r/env.txt
T=$OUT/r/tests.txt
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool gpu_turbo_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done
ts "== gpu_turbo decode" >> $T; timeout 90 ./gpu_turbo decode --include-ignored --test-threads=1 > /tmp/gt.txt 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|assert" /tmp/gt.txt >> $T
SH="1 16384 4 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3 4; do
  if [ $((rep % 2)) = 0 ]; then order="td_new td_main"; else order="td_main td_new"; fi
  for b in $order; do timeout 40 ./$b $SH --only default 2>&1 | sed "s/^/$b$rep /" >> $OUT/r/decode.txt; done
  ts "round $rep" >> $T
  [ $rep = 1 ] && timeout 60 python3 $R/scripts/bench_sdpa.py $B/jobs-decode.json $OUT/r/sdpa.json 2>&1 | tail -8 > $OUT/r/sdpa.txt
done
date -u >> $OUT/r/env.txt; grep -E "rc=|result|FAILED|panicked" $T; grep mixed $OUT/r/decode.txt | grep "B=64"; ts end
