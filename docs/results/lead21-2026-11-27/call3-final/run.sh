#!/bin/bash
# Lead, twenty-first session, final call: main 708b0c2 (the pre-passes without a division, issue-11-prepass21; the
# TurboQuant sanitizer grid with d 128 crumb kernels) on the GPU: gpu_turbo, gpu_turboquant, gpu_device_api in full,
# memcheck + racecheck on the three sanitizer grids, the fast prefill against main e13f40a's (interleaved, 3 rounds)
# with PyTorch SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l21b
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21b; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "base 1" "new 1" "new 2" "base 2" "base 3" "new 3"; do set -- $ob
  timeout 40 ./tp_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
for t in gpu_turbo gpu_turboquant gpu_device_api; do
  timeout 200 ./$t --include-ignored --test-threads=1 > $W/t_$t.txt 2>&1; echo "$(ts) $t rc=$?: $(grep 'test result' $W/t_$t.txt | tail -1)" >> $I; done
for pair in "gpu_turbo gpu_turbo_sanitizer_small" "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > $W/san_${tool}_$2.txt 2>&1; rc=$?
  echo "$(ts) $tool $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_${tool}_$2.txt) $(grep -m1 'test result' $W/san_${tool}_$2.txt)" >> $I; done; done
date -u >> $I; cd $W && tar czf $OUT/l21b.tgz *; cat $I
for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
