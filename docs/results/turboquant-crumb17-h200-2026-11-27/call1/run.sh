#!/bin/bash
# Helper, seventeenth session, issue-10-crumb17: the crumb order with an operand's two codes a byte apart (one prmt per
# f16x2 operand). Tests + compute-sanitizer on the branch's gpu_turboquant, then main a005076's turboquant_decode (tq_main)
# against the branch's (tq_new), interleaved base, new, base, new at 1 x 32k, 16 x 16k, 32 x 32k; SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-crumb17
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
run() { echo "-- $*"; timeout 60 "$@" 2>&1 | grep -E "turboquant|copy|ceiling|error|panick"; }
C=k2-v2,k3q-v2,k4q-v3,k3-v2
{ for rep in 1 2; do run ./tq_main 1 32768 --sets 4 --config $C; run ./tq_new 1 32768 --sets 4 --config $C; done
  for rep in 1 2; do run ./tq_main 16 16384 --sets 2 --config $C; run ./tq_new 16 16384 --sets 2 --config $C;
  run ./tq_main 32 32768 --sets 1 --config $C; run ./tq_new 32 32768 --sets 1 --config $C; done; } > $OUT/tq.txt 2>&1
ts bench done >> $OUT/env.txt
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $OUT/sdpa.json > $OUT/sdpa.txt 2>&1
ts sdpa done >> $OUT/env.txt
T=$OUT/tests.txt
ts "== gpu_turboquant" >> $T; timeout 150 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right" >> $T
for t in gpu_turboquant_sanitizer_small gpu_turboquant_fast_sanitizer_small; do
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $t rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
done; done
date -u >> $OUT/env.txt
cut -c1-200 $OUT/tq.txt; grep -v Warning $OUT/sdpa.txt | tail -6; grep -E "==|result|rc=|FAILED|panicked" $T
