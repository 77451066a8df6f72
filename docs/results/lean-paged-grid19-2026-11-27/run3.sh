#!/bin/bash
# Lead, nineteenth session, call 3 (H200): Lean-paper B=4 ctx 16k paged grid sweep on the merged tree's lean_paged
# (main 131f4f5 kernels): --paged-ctas N with the auto and the deep (four-stage) instance, two rounds.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; xz -dk lp.xz && chmod +x lp || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l19p
mkdir -p $FERRATTN_CACHE_DIR; W=$OUT/sweep.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "lean_paged of main 131f4f5"; } > $W
S=$(date +%s)
for rep in 1 2; do
  for n in 0 112 132 176 264 396; do for inst in auto deep; do
    extra=""; [ $n != 0 ] && extra="--paged-ctas $n"
    echo "== rep $rep ctas $n inst $inst [+$(( $(date +%s) - S ))s]" >> $W
    timeout 40 ./lp --only lean:4:16384 --paged $inst $extra 2>&1 | grep -vE "^paged instance|^shape" >> $W
  done; done
done
date -u >> $W; cat $W
