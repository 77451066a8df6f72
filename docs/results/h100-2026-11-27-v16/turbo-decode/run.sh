#!/bin/bash
# Lead, sixteenth session: TurboAttention decode on an H100, main 1eb66ef's turbo_decode against the merged tree's (c841c92:
# decode13's PDL policy for the combine), interleaved (base, new) three times, SDPA and the copy ceiling after round 1.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v16td
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3; do
  timeout 40 ./td_main $SH --only default 2>&1 | sed "s/^/base$rep /" >> $OUT/decode.txt
  timeout 40 ./td_new $SH --only default 2>&1 | sed "s/^/new$rep /" >> $OUT/decode.txt
  [ $rep = 1 ] && timeout 60 python3 $R/scripts/bench_sdpa.py jobs-decode.json $OUT/sdpa.json 2>&1 | tail -8 > $OUT/sdpa.txt
done
date -u >> $OUT/env.txt; grep -E "us|GB/s" $OUT/decode.txt | head -80; cat $OUT/sdpa.txt
