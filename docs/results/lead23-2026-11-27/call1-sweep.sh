#!/bin/bash
# Lead, twenty-third session, call 1 (H200): paged grid sweep on main a7c4377's lean_paged (e55731d kernels)
# for the four rows over 3%: --paged-ctas N (contiguous at its planner's grid), two rounds.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; xz -dk lp.xz && chmod +x lp || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l23
mkdir -p $FERRATTN_CACHE_DIR; W=$OUT/sweep.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "lean_paged of main a7c4377"; } > $W
S=$(date +%s)
for rep in 1 2; do
  for n in 0 112 168 192 216 224 240 256; do
    extra=""; [ $n != 0 ] && extra="--paged-ctas $n"
    echo "== rep $rep lean:4:16384 ctas $n [+$(( $(date +%s) - S ))s]" >> $W
    timeout 40 ./lp --only lean:4:16384 $extra 2>&1 | grep -vE "^paged instance|^shape|backtrace|^note" >> $W
  done
  for row in llama:1:8192 llama:8:8192 llama:1:32768; do
    for n in 0 64 96 160 192 256; do
      extra=""; [ $n != 0 ] && extra="--paged-ctas $n"
      echo "== rep $rep $row ctas $n [+$(( $(date +%s) - S ))s]" >> $W
      timeout 40 ./lp --only $row $extra 2>&1 | grep -vE "^paged instance|^shape|backtrace|^note" >> $W
    done
  done
done
date -u >> $W; cat $W
