#!/bin/bash
# issue-11-prefill12, prepared for the lead (not run by the helper: its device budget was spent): 07d8a0b, the
# INT32 path's oi shift moved under the next step's S wgmma (bit-identical by construction). bench_main: main
# 1eb66ef's turbo_prefill (/work/base-bins); bench_new / gpu_turbo_new: 07d8a0b. Interleaved main/new twice,
# SDPA in the same call, memcheck + racecheck on the prefill sanitizer test, the twin test (compare its
# "fast prefill" lines with docs/results/turbo-prefill12-h200-2026-11-27/call2/t_twin_s1.txt: must be equal).
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p12
mkdir -p $FERRATTN_CACHE_DIR
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$OUT/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $I
SH="4 4096 1 16384 1 32768 --causal both --only fast"
b() { timeout 25 ./bench_$1 $SH > $OUT/bench_$1_$2.txt 2>&1; echo "bench $1 $2 rc=$? t=$(el)" >> $I; }
b main 1; b new 1
timeout 25 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $OUT/sdpa.json > $OUT/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
b new 2; b main 2
for tool in memcheck racecheck; do
  timeout 15 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) t=$(el)" >> $I
done
timeout 40 ./gpu_turbo_new gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 --nocapture > $OUT/t_twin.txt 2>&1; echo "twin rc=$? t=$(el)" >> $I
cat $I; for f in $OUT/bench_*; do echo "$(basename $f)"; grep -o "[0-9]* x [0-9]* causal [a-z]* fast: [0-9.]* ms total" $f; done
grep -h "test result\|FAILED\|panicked" $OUT/t_twin.txt
