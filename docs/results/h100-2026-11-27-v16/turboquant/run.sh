#!/bin/bash
# Lead, sixteenth session: TurboQuant decode on an H100, main 1eb66ef's turboquant_decode against the merged tree's (c841c92:
# issue-10-b1's one-CTA-per-SM padding), interleaved twice at 1 x 32k (every listed configuration) and at 16 x 16k,
# 32 x 32k; SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v16tq
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
run() { echo "-- $*"; timeout 40 "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C1=k4q-v3,k3q-v2,k2-v2,k4-v3,k3-v3,k3-v2
{ for rep in 1 2; do run ./tq_main 1 32768 --sets 4 --config $C1; run ./tq_new 1 32768 --sets 4 --config $C1; done; } > $OUT/tq-b1.txt 2>&1
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $OUT/sdpa.json > $OUT/sdpa.txt 2>&1
{ for rep in 1 2; do run ./tq_main 16 16384 --sets 2 --config k4q-v3,k3q-v2,k2-v2; run ./tq_new 16 16384 --sets 2 --config k4q-v3,k3q-v2,k2-v2;
  run ./tq_main 32 32768 --sets 1 --config k4q-v3,k3q-v2,k2-v2; run ./tq_new 32 32768 --sets 1 --config k4q-v3,k3q-v2,k2-v2; done; } > $OUT/tq-big.txt 2>&1
date -u >> $OUT/env.txt; cat $OUT/tq-b1.txt | cut -c1-160; grep -v Warning $OUT/sdpa.txt | tail -5; cut -c1-160 $OUT/tq-big.txt
