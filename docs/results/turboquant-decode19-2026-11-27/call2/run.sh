#!/bin/bash
# Helper, nineteenth session, issue-10-decode19, call 2: the branch's GPU tests and compute-sanitizer, then
# main 3a6d195's turboquant_decode (tq_main, /work/base-bins19; tq_base: main's code with the bench's
# --head-dim flag, for d 64) against the branch's (tq_new), interleaved base, new three times at 1 x 32k,
# 16 x 16k, 32 x 32k (d 128 and d 64); FERRATTN_TQ_ROW_SPLIT=1 on the branch (the prepare change alone);
# ncu per launch of the branch at 16 x 16k; SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d19
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
run() { echo "-- $*"; timeout 60 "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C=k2-v2,k3-v2,k3q-v2,k4q-v3
{ for rep in 1 2 3; do
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    run ./tq_main $s --config $C; run ./tq_new $s --config $C; done
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    run ./tq_base $s --config $C --head-dim 64; run ./tq_new $s --config $C --head-dim 64; done
  echo "-- ROW_SPLIT=1"; FERRATTN_TQ_ROW_SPLIT=1 run ./tq_new 16 16384 --sets 2 --config $C
done; } > $OUT/tq.txt 2>&1
ts bench done >> $OUT/env.txt
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $OUT/sdpa.json > $OUT/sdpa.txt 2>&1
ts sdpa done >> $OUT/env.txt
M="gpu__time_duration.sum,gpc__cycles_elapsed.max,sm__cycles_active.avg,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__waves_per_multiprocessor"
{ for c in k4q-v3 k2-v2; do for bin in tq_main tq_new; do echo "== $bin 16 16384 $c"
  timeout 40 ncu --clock-control none -k "regex:turboquant_(prepare|decode|combine)" -c 3 --metrics "$M" ./$bin 16 16384 --config $c --iters 1; done; done; } > $OUT/ncu.txt 2>&1
ts ncu done >> $OUT/env.txt
T=$OUT/tests.txt
ts "== gpu_turboquant" >> $T; timeout 200 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right|skipped" >> $T
ts "== gpu_decode_matches_the_emulation, ROW_SPLIT=2 MERGE_WARPS=8" >> $T
FERRATTN_TQ_ROW_SPLIT=2 FERRATTN_TQ_MERGE_WARPS=8 timeout 100 ./gpu_turboquant gpu_decode_matches_the_emulation --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool gpu_turboquant_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
done
FERRATTN_TQ_ROW_SPLIT=2 FERRATTN_TQ_MERGE_WARPS=8 FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
echo "$(ts) racecheck ROW_SPLIT=2 MERGE_WARPS=8 rc=$rc: $(grep -m1 -E 'RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
date -u >> $OUT/env.txt
cat $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked" $T
grep -v Warning $OUT/sdpa.txt | tail -4
grep -E "^== |turboquant_|gpu__time|registers" $OUT/ncu.txt | sed -E 's/ +/ /g' | cut -c1-80
python3 summarize.py $OUT/tq.txt | tee $OUT/summary.txt
