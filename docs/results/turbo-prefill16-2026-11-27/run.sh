#!/bin/bash
# Lead, eighteenth session: prefill round 16 (a shift vote per half of a warp's rows, issue-11-prefill16) against main
# c09615c's prefill (the one-SHF shift), three rounds alternated, SDPA in the same call; the twin test, memcheck and
# racecheck on gpu_turbo_sanitizer_small, and every gpu_turbo prefill test.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf p16.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p16
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o16; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "new: issue-11-prefill16; main: c09615c"; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "main 1" "new 1" "new 2" "main 2" "main 3" "new 3"; do set -- $ob
  timeout 40 ./bench_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $I
done
timeout 150 ./gpu_turbo_new prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill.txt 2>&1; echo "$(ts) prefill tests rc=$?" >> $I
grep -E "^test |test result" $W/t_prefill.txt >> $I
date -u >> $I; cd $W && tar czf $OUT/p16.tgz *; cat $I
for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
