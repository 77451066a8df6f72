#!/bin/bash
# Lead, twenty-third session, calls 2 (H200) and 3 (H100): main a7c4377's lean_paged with the bench's workspace fix
# (every variant's workspace sized for the largest step, so paged grids smaller than the contiguous one run):
# --paged-ctas N for the four rows over 3% (contiguous at its planner's grid), two rounds.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; xz -dk lp.xz && chmod +x lp || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l23
mkdir -p $FERRATTN_CACHE_DIR; W=$OUT/sweep.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "lean_paged of main a7c4377 + bench workspace fix"; } > $W
S=$(date +%s)
for rep in 1 2; do
  for n in 0 112 168 224 256; do
    extra=""; [ $n != 0 ] && extra="--paged-ctas $n"
    echo "== rep $rep lean:4:16384 ctas $n [+$(( $(date +%s) - S ))s]" >> $W
    timeout 40 ./lp --only lean:4:16384 $extra 2>&1 | grep -vE "^paged instance|^shape|backtrace|^note" >> $W
  done
  for row in llama:1:8192 llama:8:8192 llama:1:32768; do
    for n in 0 32 64 96 160 256; do
      extra=""; [ $n != 0 ] && extra="--paged-ctas $n"
      echo "== rep $rep $row ctas $n [+$(( $(date +%s) - S ))s]" >> $W
      timeout 40 ./lp --only $row $extra 2>&1 | grep -vE "^paged instance|^shape|backtrace|^note" >> $W
    done
  done
done
date -u >> $W; cat $W
