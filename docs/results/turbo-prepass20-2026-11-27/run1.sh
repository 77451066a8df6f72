#!/bin/bash
# Lead, twentieth session, call 1 (H200): the TurboAttention pre-passes (turbo_quant_kv_*, turbo_quant_q_*) with every
# 16-byte vector of a block loaded up front (registers), against main a602be2's turbo_prefill (base-bins20), three rounds
# alternated, SDPA in the same call; the prefill tests and the TurboAttention sanitizers on the new kernels.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b1.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l20
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o20; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "main: a602be2 (base-bins20); pp: main + the pre-pass loads up front"; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "main 1" "new 1" "new 2" "main 2" "main 3" "new 3"; do set -- $ob
  if [ $1 = main ]; then bin=turbo_prefill; else bin=turbo_prefill_pp; fi
  timeout 40 ./$bin $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
timeout 150 ./gpu_turbo_pp prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill.txt 2>&1; echo "$(ts) prefill tests rc=$?" >> $I
grep -E "test result" $W/t_prefill.txt >> $I
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_pp gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt) $(grep -m1 'test result' $W/san_$tool.txt)" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/l20.tgz *; cat $I
for f in $W/bench_*; do echo "$(basename $f)"; grep -E "ms" $f | head -12; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
