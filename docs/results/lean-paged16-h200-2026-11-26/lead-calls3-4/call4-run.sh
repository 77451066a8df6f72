#!/bin/bash
# Lead, sixteenth session, second diagnostic call: the merged tree's lean_paged (597e3b9), the full list on the planners'
# grids (paged B=4 ctx 16k on 264 CTAs) and with --same-plan (paged on plan's 112 CTAs, the deep ring at d 64),
# alternated three times, on a fresh machine.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,serial,pci.bus_id --format=csv,noheader; cat COMMIT; } > $OUT/env.txt; cat $OUT/env.txt
P=$OUT/paged2.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2 3; do run ./lp_new; run ./lp_new --same-plan; done
grep -E "^\[|^lean|rc=" $P
