#!/bin/bash
# issue-11-prefill14: the exact rescale's shifts. bench_main: /work/base-bins18/turbo_prefill (main 1a4e7dc);
# bench_noshift: the same tree with turbo_prefill.cu compiled -DFERRATTN_WGF_NO_SHIFT=1 (oi never shifted:
# outputs wrong, timing only); bench_h1: -DFERRATTN_WGF_HEADROOM=1 (m moves to ceil(t) + 1 past a row's first
# tile; the twin does not follow it: timing only). Interleaved main, ns, h1, SDPA, h1, ns, main, ns.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p14
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o14; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$W/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
b() { timeout 40 ./bench_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "bench $1 $2 rc=$? t=$(el)" >> $I; }
b main 1; b noshift 1; b h1 1
timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
b h1 2; b noshift 2; b main 2; b noshift 3
date -u +%FT%TZ >> $I
cd $W && tar czf $OUT/call1.tgz *; cat $I; for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done; python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('job',{}).get('ctx'), r.get('job',{}).get('causal'), r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
