#!/bin/bash
# Helper, nineteenth session, issue-10-decode19, call 4: 32 x 32k k4q-v3 only (the one line slower in calls
# 2 and 3, +1.0% over 8 pairs with 440-486 µs of spread on both sides): 10 pairs alternating order with PDL,
# then 5 pairs with --no-pdl (the prepare's early loads can only overlap the merge before it under PDL).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz tq_main tq_new || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
run() { echo "-- $*"; timeout 60 "$@" 2>&1 | grep -E "turboquant|error|panick"; }
{ for rep in 1 2 3 4 5 6 7 8 9 10; do
  if (( rep % 2 )); then run ./tq_main 32 32768; run ./tq_new 32 32768; else run ./tq_new 32 32768; run ./tq_main 32 32768; fi; done
  for rep in 1 2 3 4 5; do
  if (( rep % 2 )); then run ./tq_main 32 32768 --no-pdl; run ./tq_new 32 32768 --no-pdl; else run ./tq_new 32 32768 --no-pdl; run ./tq_main 32 32768 --no-pdl; fi; done
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader; } > $OUT/tq.txt 2>&1
ts bench done >> $OUT/env.txt; date -u >> $OUT/env.txt
cat $OUT/env.txt
grep -E "^--|turboquant" $OUT/tq.txt | sed -E 's/ per step.*//; s/turboquant B=32 ctx=32768 (d=128 )?//' | paste - - | cut -c1-120
