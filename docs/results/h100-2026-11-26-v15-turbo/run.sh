#!/bin/bash
# Lead, fifteenth session: issue 11 on an H100 with main's kernels of 596b601 (prefill round 11, decode round 11): the default (fast)
# decode over the INT4 and mixed caches and the fast prefill, PyTorch SDPA (cuDNN, flash) in the same call, twice.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; R=$(cd .. && pwd); tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l15
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.mem --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
timeout 90 ./turbo_decode $SH --only default 2>&1 | tee $OUT/decode1.txt
timeout 70 python3 $R/scripts/bench_sdpa.py jobs-decode.json $OUT/sdpa-decode.json 2>&1 | tail -8 | tee $OUT/sdpa-decode.txt
timeout 90 ./turbo_prefill 4 4096 1 16384 1 32768 --causal both --only fast 2>&1 | tee $OUT/prefill1.txt
timeout 90 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $OUT/sdpa-prefill.json 2>&1 | tail -10 | tee $OUT/sdpa-prefill.txt
timeout 60 ./turbo_prefill 4 4096 1 16384 1 32768 --causal both --only fast 2>&1 | tee $OUT/prefill2.txt
timeout 60 ./turbo_decode $SH --only default 2>&1 | tee $OUT/decode2.txt
date -u >> $OUT/env.txt
