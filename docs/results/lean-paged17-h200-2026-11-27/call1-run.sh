#!/bin/bash
# Lead, seventeenth session: the Lean paged list on an H200, main a005076's lean_paged against 4aae36b's (plan_paged takes
# plan's 112-CTA grid at head dim 64 where the four-stage ring runs), both on the planners' grids, alternated twice.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf lp.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,serial,pci.bus_id,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt; cat $OUT/env.txt
P=$OUT/paged.txt
run() { ts "$*" >> $P; timeout 60 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2; do run ./lp_base; run ./lp_new; done
grep -vE "^$" $P | grep -E "^\[|lean|llama|Lean|Llama|rc=" | head -120
