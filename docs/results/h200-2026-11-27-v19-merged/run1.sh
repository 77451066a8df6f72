#!/bin/bash
# Lead, nineteenth session, call 1 (H200): the merged tree 131f4f5 (decode19's balanced cut, TurboQuant decode19,
# the Lean stamps diagnostic off): every GPU suite, memcheck/racecheck on the TurboQuant and TurboAttention small grids;
# prefill round 17 (the shift vote before the codes, issue-11-prefill17 388dfbe) against the merged tree's prefill,
# three rounds alternated, SDPA in the same call, its prefill tests and sanitizer.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b1.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l19
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o19; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "merged: main 131f4f5; p17: issue-11-prefill17 388dfbe"; } > $I
san() { for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $I; done; }
san gpu_turboquant gpu_turboquant_sanitizer_small; san gpu_turbo gpu_turbo_sanitizer_small; san gpu_turbo_p17 gpu_turbo_sanitizer_small
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "main 1" "new 1" "new 2" "main 2" "main 3" "new 3"; do set -- $ob
  if [ $1 = main ]; then bin=turbo_prefill; else bin=turbo_prefill_p17; fi
  timeout 40 ./$bin $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
timeout 150 ./gpu_turbo_p17 prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill_p17.txt 2>&1; echo "$(ts) p17 prefill tests rc=$?" >> $I
grep -E "test result" $W/t_prefill_p17.txt >> $I
for t in gpu_turboquant gpu_turbo gpu_lean gpu_device_api; do
  extra=""; [ $t = gpu_lean ] && extra="--skip nvrtc"
  timeout 200 ./$t --include-ignored --test-threads=1 $extra > $W/t_$t.txt 2>&1; echo "$(ts) $t rc=$?: $(grep 'test result' $W/t_$t.txt | tail -1)" >> $I
done
date -u >> $I; cd $W && tar czf $OUT/l19.tgz *; cat $I
for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
