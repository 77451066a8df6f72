#!/bin/bash
# issue-11-decode19 call 2 (helper): the balanced cut of 430af36 (every unit's share of the cost, capped).
# memcheck on gpu_turbo_sanitizer_small, gpu_turbo balanced (new binary 430af36), then turbo_decode:
# main's binary (td_main, /work/base-bins19) and the branch's (td_new: auto = main's rule; bal = the cost cut)
# interleaved four rounds (order swapped every round), small-work and INT4 unit counts each round, SDPA after round 1.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins2.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d19
mkdir -p $FERRATTN_CACHE_DIR $OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "td_main: main 3a6d195 (/work/base-bins19); td_new, gpu_turbo: issue-11-decode19 430af36"; } | tee $OUT/r/env.txt
T=$OUT/r/tests.txt
FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
echo "$(ts) memcheck gpu_turbo_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY' /tmp/san.txt)" >> $T
ts "== gpu_turbo balanced" >> $T; timeout 60 ./gpu_turbo balanced --include-ignored --test-threads=1 > /tmp/gt.txt 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|assert" /tmp/gt.txt >> $T
cat $T
SH="1 16384 4 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3 4; do
  if [ $((rep % 2)) = 0 ]; then order="td_new td_main"; U="bal,auto"; C="28:7,21:7"; else order="td_main td_new"; U="auto,bal"; C="21:7,28:7"; fi
  for b in $order; do
    if [ $b = td_main ]; then timeout 40 ./td_main $SH --only default 2>&1 | sed "s/^/td_main$rep /" >> $OUT/r/decode.txt
    else timeout 90 ./td_new $SH --only default --units $U --costs $C 2>&1 | sed "s/^/td_new$rep /" >> $OUT/r/decode.txt; fi
  done
  timeout 30 ./td_new 4 16384 --only default --units 768,1024,1280,bal:1024,bal:1280 --costs 21:7 2>&1 | sed "s/^/sw$rep /" >> $OUT/r/sweep.txt
  timeout 30 ./td_new 64 4096 16 16384 8 32768 32 32768 --bits int4 --only default --units 1024,bal:1024 --costs 21:7 2>&1 | sed "s/^/sw$rep /" >> $OUT/r/sweep.txt
  ts "round $rep" >> $T
  [ $rep = 1 ] && timeout 60 python3 $R/scripts/bench_sdpa.py $B/jobs-decode.json $OUT/r/sdpa.json 2>&1 | tail -8 > $OUT/r/sdpa.txt
done
date -u >> $OUT/r/env.txt; cd $OUT && tar czf d19-call2.tgz r; tail -3 $T; ts end
