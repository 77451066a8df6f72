#!/bin/bash
# Helper, nineteenth session, issue-10-decode19, call 5: the merge's row split around the new rule's
# bounds, the branch's binary only (FERRATTN_TQ_ROW_SPLIT forces a split; MERGE_WARPS the CTA size):
# 16 x 16k (128 tiles: default 2) against 4 CTAs a tile of 8 or 16 warps; 32 x 16k and 32 x 32k (256 tiles:
# default 1) against 2 CTAs of 8 warps (two waves). Pairs alternate (default, forced / forced, default).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz tq_new || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
run() { echo "-- $*"; env "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C=k2-v2,k3q-v2,k4q-v3
{ for rep in 1 2; do
  run X=default timeout 60 ./tq_new 16 16384 --sets 2 --config $C
  run FERRATTN_TQ_ROW_SPLIT=4 FERRATTN_TQ_MERGE_WARPS=8 timeout 60 ./tq_new 16 16384 --sets 2 --config $C
  run FERRATTN_TQ_ROW_SPLIT=4 timeout 60 ./tq_new 16 16384 --sets 2 --config $C
  run X=default timeout 60 ./tq_new 16 16384 --sets 2 --config $C; done
  for rep in 1 2 3; do for s in "32 16384" "32 32768"; do
  if (( rep % 2 )); then run X=default timeout 60 ./tq_new $s --config $C; run FERRATTN_TQ_ROW_SPLIT=2 timeout 60 ./tq_new $s --config $C;
  else run FERRATTN_TQ_ROW_SPLIT=2 timeout 60 ./tq_new $s --config $C; run X=default timeout 60 ./tq_new $s --config $C; fi; done; done; } > $OUT/tq.txt 2>&1
ts bench done >> $OUT/env.txt; date -u >> $OUT/env.txt
cat $OUT/env.txt
grep -E "^--|turboquant" $OUT/tq.txt | sed -E 's/ ms per step.*//; s/turboquant B=[0-9]+ ctx=[0-9]+ d=128 //; s/timeout 60 .\/tq_new //; s/--config .*//' | paste - - - - | cut -c1-150
