#!/bin/bash
# Lead, twenty-second session, call 1: main 5b5cadd on the GPU (gpu_turbo decode + prefill tests, gpu_device_api,
# sanitizers), the no-shift ceiling of the fast prefill at the tip (-DFERRATTN_WGF_NO_SHIFT=1, timing only, wrong
# outputs) interleaved with the tip, the turbo decode lines (tip vs e13f40a's binary: one SHF reordered), SDPA same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l22
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o22; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "main 1" "noshift 1" "noshift 2" "main 2" "main 3" "noshift 3"; do set -- $ob
  timeout 40 ./tp_$1 $SH > $W/prefill_$1_$2.txt 2>&1; rc=$?; echo "$(ts) prefill $1 $2 rc=$rc" >> $I
  [ "$1 $2" = "noshift 1" ] && { timeout 60 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa_prefill.json > $W/sdpa_prefill_log.txt 2>&1; rc=$?; echo "$(ts) sdpa prefill rc=$rc" >> $I; }
done
DS="1 16384 16 16384 8 32768 64 4096 32 32768"
for ob in "base 1" "main 1" "main 2" "base 2"; do set -- $ob
  timeout 60 ./td_$1 $DS > $W/decode_$1_$2.txt 2>&1; rc=$?; echo "$(ts) decode $1 $2 rc=$rc" >> $I
  [ "$1 $2" = "main 1" ] && { timeout 60 python3 $R/scripts/bench_sdpa.py jobs-decode.json $W/sdpa_decode.json > $W/sdpa_decode_log.txt 2>&1; rc=$?; echo "$(ts) sdpa decode rc=$rc" >> $I; }
done
timeout 150 ./gpu_turbo --include-ignored --test-threads=1 > $W/t_gpu_turbo.txt 2>&1; rc=$?; echo "$(ts) gpu_turbo rc=$rc: $(grep 'test result' $W/t_gpu_turbo.txt | tail -1)" >> $I
timeout 60 ./gpu_device_api --include-ignored --test-threads=1 > $W/t_gpu_device_api.txt 2>&1; rc=$?; echo "$(ts) gpu_device_api rc=$rc: $(grep 'test result' $W/t_gpu_device_api.txt | tail -1)" >> $I
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_${tool}.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_${tool}.txt) $(grep -m1 'test result' $W/san_${tool}.txt)" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/l22a.tgz *; cat $I
for f in $W/prefill_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
for f in $W/decode_*; do echo "$(basename $f)"; tail -12 $f; done
python3 -c "
import json
for n in ['sdpa_prefill','sdpa_decode']:
  d=json.load(open('$W/'+n+'.json'));print(n, d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
