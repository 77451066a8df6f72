#!/bin/bash
# issue-9-probe17: the Triton paged-read probe (scripts/paged_read_probe.py of the branch), every shape, grids of 1, 2, 4 programs per SM.
# (the tail filter of the run itself is dropped here; it only shortened the printed output)
B=$(cd "$(dirname "$0")" && pwd); cd "$B"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH TRITON_CACHE_DIR=/tmp/triton-cache-p9
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total --format=csv,noheader; cat COMMIT 2>/dev/null; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/env.txt
timeout 210 python3 paged_read_probe.py --per-sm 1,2,4 --reps 25 --json $OUT/probe.json > $OUT/probe.txt 2>&1
echo "rc $?" | tee -a $OUT/probe.txt
date -u >> $OUT/env.txt
cat $OUT/probe.txt
