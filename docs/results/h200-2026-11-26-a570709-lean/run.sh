#!/bin/bash
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
timeout 200 ./ferrattn bench --suite standard --algo lean --backend cuda --out $OUT/bl > $OUT/bench-lean.md 2> $OUT/bench-lean.log; echo "rc=$?"
ls $OUT/bl; cp $OUT/bl/*.json $OUT/ 2>/dev/null; rm -rf $OUT/bl/*.png
grep -E '^\|' $OUT/bench-lean.md | head -60
