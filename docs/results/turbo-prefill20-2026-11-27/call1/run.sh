#!/bin/bash
# issue-11-prefill20 (helper), call 1: the rescale shift on two pipes (half of O biased, IMAD.HI; half SHF.R.S64)
# against main a602be2's prefill (/work/base-bins20/turbo_prefill), interleaved main, new, SDPA, new, main, main, new;
# memcheck + racecheck on gpu_turbo_sanitizer_small (new); gpu_turbo prefill --include-ignored (new).
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p20
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o20; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "main: a602be2 (base-bins20); new: issue-11-prefill20 $(cat commit.txt)"; } > $I
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt) $(grep -m1 'test result' $W/san_$tool.txt)" >> $I; done
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "main 1" "new 1" "new 2" "main 2" "main 3" "new 3"; do set -- $ob
  timeout 40 ./turbo_prefill_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
timeout 150 ./gpu_turbo_new prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill.txt 2>&1; echo "$(ts) prefill tests rc=$?" >> $I
grep -E "test result" $W/t_prefill.txt >> $I
date -u >> $I; cd $W && tar czf $OUT/p20.tgz *; cat $I
for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
grep -h "copy\|ceiling" $W/bench_new_1.txt | head -3
