#!/bin/bash
# issue-11-decode19 call 1 (helper): DecodeSchedule::Balanced (a stream-K cut by cost) against main's equal cut.
# memcheck/racecheck on gpu_turbo_sanitizer_small and gpu_turbo decode (new binary 441c455), then turbo_decode:
# main's binary (td_main, /work/base-bins19) and the branch's (td_new: auto = main's rule, bal = the cost cut per
# --costs) interleaved three rounds (order swapped in round 2), SDPA + copy ceiling after round 1, then a units sweep.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins1.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d19
mkdir -p $FERRATTN_CACHE_DIR $OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "td_main: main 3a6d195 (/work/base-bins19); td_new, gpu_turbo: issue-11-decode19 441c455"; } | tee $OUT/r/env.txt
T=$OUT/r/tests.txt
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool gpu_turbo_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
  tail -5 /tmp/san.txt > $OUT/r/san-$tool.txt
done
ts "== gpu_turbo decode" >> $T; timeout 90 ./gpu_turbo decode --include-ignored --test-threads=1 > /tmp/gt.txt 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|assert|SKIPPED|steps equal" /tmp/gt.txt >> $T
cat $T
ts "== bench" >> $T
SH="1 16384 4 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3; do
  if [ $rep = 2 ]; then order="td_new td_main"; U="bal,auto"; C="24:12,28:7,21:7,16:0"; else order="td_main td_new"; U="auto,bal"; C="16:0,21:7,28:7,24:12"; fi
  for b in $order; do
    if [ $b = td_main ]; then timeout 40 ./td_main $SH --only default 2>&1 | sed "s/^/td_main$rep /" >> $OUT/r/decode.txt
    else timeout 90 ./td_new $SH --only default --units $U --costs $C 2>&1 | sed "s/^/td_new$rep /" >> $OUT/r/decode.txt; fi
    ts "$b $rep" >> $T
  done
  [ $rep = 1 ] && timeout 60 python3 $R/scripts/bench_sdpa.py $B/jobs-decode.json $OUT/r/sdpa.json 2>&1 | tail -8 > $OUT/r/sdpa.txt
done
ts "== units sweep" >> $T
W=$OUT/r/sweep.txt
timeout 20 ./td_new 64 4096 --only default --units 512,1024,1536,2048 >> $W 2>&1
timeout 20 ./td_new 16 16384 8 32768 --only default --units 1024,1536,2048 >> $W 2>&1
timeout 20 ./td_new 32 32768 --only default --units 1024,1536,3168 >> $W 2>&1
timeout 20 ./td_new 1 16384 --only default --units 128,256,1024,1584 >> $W 2>&1
timeout 20 ./td_new 4 16384 --only default --units 512,1024,2048 >> $W 2>&1
ts "done" >> $T
date -u >> $OUT/r/env.txt; cd $OUT && tar czf d19-call1.tgz r && rm -rf r; tail -4 $T; ts end
