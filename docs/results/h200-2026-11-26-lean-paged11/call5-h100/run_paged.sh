#!/bin/bash
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in old new old new; do echo "== $v full list (rotated)" >> $P; timeout 60 ./lean_paged_$v >> $P 2>&1; done
for v in old new new; do echo "== $v --same-plan full list (rotated)" >> $P; timeout 60 ./lean_paged_$v --same-plan >> $P 2>&1; done
cat $P
