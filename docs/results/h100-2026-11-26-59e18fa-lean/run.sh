#!/bin/bash
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
{ date; nvidia-smi --query-gpu=name,driver_version,clocks.mem --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
./ferrattn devices > $OUT/devices.txt 2>&1
timeout 100 ./lean_paged --quick --out $OUT/lean_paged.json > $OUT/lean_paged.txt 2>&1
timeout 280 ./ferrattn bench --suite standard --algo lean --backend cuda --out /tmp/bl > /tmp/bl.md 2> $OUT/bench-lean.log; echo "bench rc=$?" >> $OUT/env.txt
cp /tmp/bl/bench.json $OUT/bench-lean.json; cp /tmp/bl.md $OUT/bench-lean.md
cat $OUT/env.txt $OUT/devices.txt $OUT/lean_paged.txt; grep -E "^\| " /tmp/bl.md | head -60
