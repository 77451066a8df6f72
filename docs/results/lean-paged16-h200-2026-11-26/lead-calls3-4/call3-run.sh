#!/bin/bash
# Lead, sixteenth session: why Lean-paper B=4 ctx 16k on the contiguous plan's 112 CTAs (paged16's deep ring at d 64)
# ran 0.99-1.05x alone but 1.08-1.11x inside the full list. Merged tree (597e3b9) and main 1eb66ef's lean_paged:
# --same-plan full list, then --same-plan --only lean:4:16384 alone, base and new, and the planners' grids alone.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt; cat $OUT/env.txt
P=$OUT/paged.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
run ./lp_new --same-plan
run ./lp_new --same-plan --only lean:4:16384
run ./lp_base --same-plan --only lean:4:16384
run ./lp_new --only lean:4:16384
run ./lp_new --same-plan --only lean:4:16384
run ./lp_base --same-plan
run ./lp_new --same-plan
grep -E "^\[|^lean|rc=" $P
