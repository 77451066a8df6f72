#!/bin/bash
# Lead, twenty-second session, call 2 (H100): the fast prefill's no-shift ceiling at the tip against the tip, SDPA same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l22b
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o22b; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "main 1" "noshift 1" "noshift 2" "main 2" "main 3" "noshift 3"; do set -- $ob
  timeout 40 ./tp_$1 $SH > $W/prefill_$1_$2.txt 2>&1; rc=$?; echo "$(ts) prefill $1 $2 rc=$rc" >> $I
  [ "$1 $2" = "noshift 1" ] && { timeout 60 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa_prefill.json > $W/sdpa_prefill_log.txt 2>&1; rc=$?; echo "$(ts) sdpa prefill rc=$rc" >> $I; }
done
date -u >> $I; cd $W && tar czf $OUT/l22b.tgz *; cat $I
for f in $W/prefill_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json
d=json.load(open('$W/sdpa_prefill.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
