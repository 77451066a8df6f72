#!/bin/bash
# issue-11-prefill14, prepared for the lead (not run by the helper: its device budget went to the noshift bound):
# 49e595d, the INT32 path's oi shift as one SHF.R.S64 a register for both moves (bit-identical by construction).
# bench_main: /work/base-bins18/turbo_prefill (main 1a4e7dc); bench_pair / gpu_turbo_pair: 49e595d. Interleaved
# main, pair, SDPA, pair, main; memcheck + racecheck on the prefill sanitizer test; the twin test (its "fast
# prefill" lines must equal docs/results/turbo-prefill13-h200-2026-11-27/call2/t_twin.txt's).
# Lives in /work/main/.gpu-bundle-issue-11-prefill14/ as run_pair.sh beside pair.tar.xz and jobs-prefill.json.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf pair.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p14
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o14b; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$W/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; echo "49e595d (one SHF.R.S64 shift); bench_main: /work/base-bins18/turbo_prefill (main 1a4e7dc)"; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
b() { timeout 40 ./bench_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "bench $1 $2 rc=$? t=$(el)" >> $I; }
b main 1; b pair 1
timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
b pair 2; b main 2
for tool in memcheck racecheck; do
  timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_pair gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) t=$(el)" >> $I
done
timeout 60 ./gpu_turbo_pair gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 --nocapture > $W/t_twin.txt 2>&1; echo "twin rc=$? t=$(el)" >> $I
date -u +%FT%TZ >> $I
cd $W && tar czf $OUT/pair.tgz *; cat $I; for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
grep -h "test result\|FAILED\|panicked" $W/t_twin.txt; python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
