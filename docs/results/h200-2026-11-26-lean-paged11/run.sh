#!/bin/bash
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
for r in 1 2; do
  echo "== run $r: sets rotated over >= 4x L2 (default)"; ./lean_paged --out $OUT/rot$r.json 2>&1 | tee $OUT/rot$r.txt
  echo "== run $r: --sets 1 (the method before)"; ./lean_paged --sets 1 --out $OUT/one$r.json 2>&1 | tee $OUT/one$r.txt
done
