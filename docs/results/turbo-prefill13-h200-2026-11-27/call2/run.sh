#!/bin/bash
# issue-11-prefill13 call 2: SDPA (cuDNN, flash) with main / p0 / p1 interleaved again (call 1's sdpa.json did
# not come back: the tool returns at most 8 files), and the default kernel's twin test lines. One tarball out.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p13
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o2; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$W/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $I
SH="4 4096 1 16384 1 32768 --causal both --only fast"
bm() { timeout 25 ./bench_main $SH > $W/bench_main_$1.txt 2>&1; echo "bench main $1 rc=$? t=$(el)" >> $I; }
bn() { FERRATTN_WGF_PERSIST=$1 timeout 25 ./bench_new $SH > $W/bench_p$1_$2.txt 2>&1; echo "bench p$1 $2 rc=$? t=$(el)" >> $I; }
bm 3; bn 1 3
timeout 30 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
bn 0 3
timeout 30 ./gpu_turbo_new gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 --nocapture > $W/t_twin.txt 2>&1; echo "twin (default) rc=$? t=$(el)" >> $I
cd $W && tar czf $OUT/call2.tgz *; cat $I; for f in $W/bench_*; do echo "$(basename $f)"; grep -o "[0-9]* x [0-9]* causal [a-z]* fast: [0-9.]* ms total" $f; done; grep -h "test result" $W/t_twin.txt; python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d['ceilings']);[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
