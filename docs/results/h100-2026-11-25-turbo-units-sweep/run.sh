#!/usr/bin/env bash
# B=1 TurboAttention decode: stream-K width sweep (g4, INT4 and mixed) and SDPA in the same call.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
{ date -u; nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader; } | tee $OUT/sweep.txt
timeout 150 $S/turbo_decode 1 8192 1 16384 1 32768 4 16384 --only g4 --units auto,256,384,768,1024,1584 2>&1 | tee -a $OUT/sweep.txt
timeout 120 python3 $S/bench_sdpa.py $S/jobs.json $OUT/sdpa.json 2>&1 | tee -a $OUT/sweep.txt
