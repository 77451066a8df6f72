#!/bin/bash
# Helper, twenty-first session, issue-10-decode22, call 1 (half the 2-bit key operands on the FMA pipe, d 128, <= 8 rows):
# the branch's GPU tests and compute-sanitizer (the small test now includes d 128 k2-v2 / k3q-v2), then main's
# turboquant_decode (tq_base: /work/base-bins21/turboquant_decode, main e13f40a's kernels) against the branch's (tq_new),
# interleaved three times (order swapped every round) at 1 x 32k, 16 x 16k, 32 x 32k, d 128; ncu of the decode alone at
# 32 x 32k (k2-v2, k3q-v2) for both; SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d22
mkdir -p $FERRATTN_CACHE_DIR; mkdir -p $OUT/r; O=$OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $O/env.txt
T=$O/tests.txt
ts "== gpu_turboquant" >> $T; timeout 150 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right|skipped" >> $T
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 75 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool gpu_turboquant_sanitizer_small rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
  grep -m3 -E "panicked|Invalid|Race" /tmp/san.txt >> $T
done
ts tests done >> $O/env.txt
run() { echo "-- $*"; env "$@" 2>&1 | grep -E "turboquant|error|panick|copy"; }
C=k2-v2,k3-v2,k3q-v2,k4q-v3
{ for rep in 1 2 3; do
  if (( rep % 2 )); then A=tq_base; Z=tq_new; else A=tq_new; Z=tq_base; fi
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    run timeout 60 ./$A $s --config $C; run timeout 60 ./$Z $s --config $C; done
done; } > $O/tq.txt 2>&1
ts bench done >> $O/env.txt
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $O/sdpa.json > $O/sdpa.txt 2>&1
ts sdpa done >> $O/env.txt
M="gpu__time_duration.sum,sm__cycles_active.avg,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__registers_per_thread,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active,smsp__warps_eligible.avg.per_cycle_active"
for r in wait math_pipe_throttle not_selected short_scoreboard; do M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
{ for c in k2-v2 k3q-v2; do for bin in tq_base tq_new; do echo "== $bin 32 32768 $c"
  timeout 30 ncu --clock-control none -k "regex:turboquant_decode" -c 1 --metrics "$M" ./$bin 32 32768 --config $c --iters 1; done; done; } > $O/ncu.txt 2>&1
ts ncu done >> $O/env.txt
date -u >> $O/env.txt
python3 summarize.py $O/tq.txt > $O/summary.txt
cp run.sh summarize.py COMMIT $O/; tar czf $OUT/d22call1.tgz -C $OUT r
cat $O/env.txt; grep -E "==|result|rc=|FAILED|panicked|Invalid|Race" $T
grep -v Warning $O/sdpa.txt | tail -4
grep -E "^== |gpu__time|issue_active|inst_executed|registers_per|pipe_alu|pipe_fma|pipe_fp16" $O/ncu.txt | sed -E 's/ +/ /g' | cut -c1-100
grep -m2 copy $O/tq.txt; cat $O/summary.txt
