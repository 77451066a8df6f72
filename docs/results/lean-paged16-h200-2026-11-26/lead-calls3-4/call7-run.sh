#!/bin/bash
# Lead, sixteenth session: the Lean paged list on an H100, main 1eb66ef's lean_paged against the merged tree's (597e3b9,
# deep ring at d 64 on one-CTA-per-SM grids), both on the planners' grids, alternated twice (full list).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,serial,pci.bus_id --format=csv,noheader; cat COMMIT; } > $OUT/env.txt; cat $OUT/env.txt
P=$OUT/paged3.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2; do run ./lp_base; run ./lp_new; done
grep -vE "^$" $P | grep -E "^\[|^lean|^llama|rc="
