#!/bin/bash
# Lead, seventeenth session: TurboAttention decode on an H100, main a005076's turbo_decode against the merged tree's
# (decode14: the branch-dispatch instance for the mixed cache at >= one CTA per SM), interleaved three times with the
# order swapped, SDPA and the copy ceiling after round 1.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf hbins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v17td
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat HCOMMIT; } | tee $OUT/env.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2 3; do
  if [ $rep = 2 ]; then order="td_new td_main"; else order="td_main td_new"; fi
  for b in $order; do timeout 40 ./$b $SH --only default 2>&1 | sed "s/^/$b$rep /" >> $OUT/decode.txt; done
  [ $rep = 1 ] && timeout 60 python3 $R/scripts/bench_sdpa.py $R/docs/results/h100-2026-11-27-v16/turbo-decode/jobs-decode.json $OUT/sdpa.json 2>&1 | tail -8 > $OUT/sdpa.txt
done
date -u >> $OUT/env.txt; grep -E "us|GB/s" $OUT/decode.txt | head -90; cat $OUT/sdpa.txt
