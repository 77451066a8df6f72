#!/bin/bash
# Helper, nineteenth session, issue-10-decode19, call 3: 32 x 32k k4q-v3 (+1.8% in call 2, the shape with
# 3-7% run-to-run spread in earlier passes) five more times, the order alternating (base, new / new, base),
# k3q-v2 beside it; ncu of the three launches at 32 x 32k for both binaries (the prepare is the only change
# there); memcheck with the merge forced to 2 CTAs of 8 warps per tile.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins.tar.xz tq_main tq_new gpu_turboquant || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d19
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
run() { echo "-- $*"; timeout 60 "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C=k4q-v3,k3q-v2
{ for rep in 1 2 3 4 5; do
  if (( rep % 2 )); then run ./tq_main 32 32768 --config $C; run ./tq_new 32 32768 --config $C;
  else run ./tq_new 32 32768 --config $C; run ./tq_main 32 32768 --config $C; fi; done; } > $OUT/tq.txt 2>&1
ts bench done >> $OUT/env.txt
M="gpu__time_duration.sum,gpc__cycles_elapsed.max,sm__cycles_active.avg,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__grid_size,launch__registers_per_thread"
{ for bin in tq_main tq_new tq_main tq_new; do echo "== $bin 32 32768 k4q-v3"
  timeout 40 ncu --clock-control none -k "regex:turboquant_(prepare|decode|combine)" -c 3 --metrics "$M" ./$bin 32 32768 --config k4q-v3 --iters 1; done; } > $OUT/ncu.txt 2>&1
ts ncu done >> $OUT/env.txt
T=$OUT/tests.txt
FERRATTN_TQ_ROW_SPLIT=2 FERRATTN_TQ_MERGE_WARPS=8 FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
echo "$(ts) memcheck ROW_SPLIT=2 MERGE_WARPS=8 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
date -u >> $OUT/env.txt
cat $OUT/env.txt $T
grep -E "^== |turboquant_|gpu__time|cycles" $OUT/ncu.txt | sed -E 's/ +/ /g' | cut -c1-80
grep -E "^--|turboquant" $OUT/tq.txt | sed -E 's/ per step.*//' | paste - - - | cut -c1-200
