#!/bin/bash
# issue-11-prepass21, call 3: v3 = v2 + issue-11-pdl20 merged (the prefill's three launches under PDL, FERRATTN_TA_PDL=1)
# against v2 (f4ab0e9, call 2) and main (base-bins21 e13f40a), three rounds interleaved, SDPA in the same call; with PDL
# on: v3's prefill tests, the device path's fast prefill, the fast twin twice more, memcheck + racecheck.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b3.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p21
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21c; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "base 1" "v2 1" "on 1" "on 2" "v2 2" "base 2" "base 3" "on 3" "v2 3"; do set -- $ob
  case $1 in base) bin=./turbo_prefill_base; env=;; v2) bin=./turbo_prefill_v2; env=;; on) bin=./turbo_prefill_v3; env=FERRATTN_TA_PDL=1;; esac
  env $env timeout 40 $bin $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "on 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
export FERRATTN_TA_PDL=1
timeout 150 ./gpu_turbo_v3 prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill_pdl1.txt 2>&1
echo "$(ts) prefill tests PDL=1 rc=$?: $(grep -m1 'test result' $W/t_prefill_pdl1.txt)" >> $I
timeout 60 ./gpu_device_api_v3 gpu_turbo_fast_prefill_device_path_matches_the_host_path --include-ignored --test-threads=1 > $W/t_device_pdl1.txt 2>&1
echo "$(ts) device path PDL=1 rc=$?: $(grep -m1 'test result' $W/t_device_pdl1.txt)" >> $I
for i in 1 2; do timeout 60 ./gpu_turbo_v3 gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 > $W/t_twin_rep$i.txt 2>&1
  echo "$(ts) fast twin repeat $i PDL=1 rc=$?: $(grep -m1 'test result' $W/t_twin_rep$i.txt)" >> $I; done
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_v3 gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$(ts) $tool (PDL on) rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt) $(grep -m1 'test result' $W/san_$tool.txt)" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/p21c.tgz *; cat $I
for v in base v2 on; do for f in $W/bench_${v}_*; do echo "$(basename $f)"; grep -E "ms" $f | sed 's/turbo prefill //; s/ TFLOP.*//'; done; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
