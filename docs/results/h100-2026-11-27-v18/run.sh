#!/bin/bash
# Lead, eighteenth session: the merged tree (64851b6's kernels: prefill14's one-SHF shift, compress11) on an H100:
# gpu_turbo and gpu_turboquant (all), memcheck/racecheck on their small grids, turbo_prefill and turboquant_compress
# against main 1a4e7dc's (main, new, new, main), PyTorch SDPA for the prefill shapes in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v18h
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
T=$OUT/tests.txt
PSH="4 4096 1 32768 --causal both --only fast --inputs both"
for b in tp_main tp_new; do timeout 60 ./$b $PSH > $OUT/prefill_${b}_1.txt 2>&1; echo "$(ts) $b 1 rc=$?" >> $T; done
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $OUT/sdpa.json > $OUT/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $T
for b in tp_new tp_main; do timeout 60 ./$b $PSH > $OUT/prefill_${b}_2.txt 2>&1; echo "$(ts) $b 2 rc=$?" >> $T; done
for ob in "tqc_main 1" "tqc_new 1" "tqc_new 2" "tqc_main 2"; do set -- $ob; timeout 60 ./$1 --only fast,split > $OUT/compress_$1_$2.txt 2>&1; echo "$(ts) $1 $2 rc=$?" >> $T; done
for pair in "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_turboquant" >> $T; timeout 150 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "== gpu_turbo" >> $T; timeout 200 ./gpu_turbo --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
date -u >> $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked" $T
for f in $OUT/prefill_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json;d=json.load(open('$OUT/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
for f in $OUT/compress_*; do echo "$(basename $f)"; grep -E '16 x 4096' $f | cut -d'|' -f2-8; done; ts done
