#!/bin/bash
# issue-11-prefill12 (helper, sixteenth session), call 3: round 11's per-CTA timeline
# (-DFERRATTN_WGF_TIMELINE=1, docs/results/turbo-prefill11-h200-2026-11-26/nvcc_timeline.sh) of 8afddbf's
# kernel under FERRATTN_WGF_STAGGER 0 (main's start), 1 and 2: whether the warpgroups stay out of phase and
# whether tiles 0-8 are still slower than the later ones. Traces of the last attention launch of the bench.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p12 FERRATTN_WGF_TRACE=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$OUT/info.txt; W=/tmp/tl; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $I
for m in 0 1 2; do mkdir -p $W/s$m
  FERRATTN_WGF_STAGGER=$m timeout 20 ./bench_tl 4 4096 --causal both --only fast --trace $W/s$m >> $OUT/tl_bench.txt 2>&1; echo "s$m 4k rc=$? t=$(el)" >> $I
  FERRATTN_WGF_STAGGER=$m timeout 20 ./bench_tl 1 32768 --causal no --only fast --trace $W/s$m >> $OUT/tl_bench.txt 2>&1; echo "s$m 32k rc=$? t=$(el)" >> $I
done
for m in 0 1 2; do (cd $W && python3 $B/timeline_ramp.py s$m/*.bin) >> $OUT/timeline_ramp.txt 2>&1; (cd $W && python3 $B/timeline.py s$m/*.bin) >> $OUT/timeline.md 2>&1; done
(cd $W && tar cJf $OUT/traces.tar.xz s0 s1 s2); echo "done t=$(el)" >> $I
cat $I; grep -o "[0-9]* x [0-9]* causal [a-z]* fast: [0-9.]* ms total, [0-9.]* ms attention" $OUT/tl_bench.txt; cat $OUT/timeline_ramp.txt
