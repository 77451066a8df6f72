#!/bin/bash
# Lead, nineteenth session, call 4 (H100): main 131f4f5's lean_paged, full list, twice (paged vs contiguous on the H100).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; xz -dk lp.xz && chmod +x lp || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l19q
mkdir -p $FERRATTN_CACHE_DIR; W=$OUT/paged_h100.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "lean_paged of main 131f4f5"; } > $W
for r in 1 2; do echo "== run $r" >> $W; timeout 120 ./lp >> $W 2>&1; done
date -u >> $W; cat $W
