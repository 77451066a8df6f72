#!/bin/bash
# Helper, twenty-first session, issue-10-decode22, call 2 (call 1's change with c = t (p + q|t|) + r, exact for the 1-bit key
# codebook of 2-bit QJL keys too; no ncu this time):
# the branch's GPU tests and compute-sanitizer (the small test now includes d 128 k2-v2 / k3q-v2), then main's
# turboquant_decode (tq_base: /work/base-bins21/turboquant_decode, main e13f40a's kernels) against the branch's (tq_new),
# interleaved three times (order swapped every round) at 1 x 32k, 16 x 16k, 32 x 32k, d 128;
# SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d22
mkdir -p $FERRATTN_CACHE_DIR; mkdir -p $OUT/r; O=$OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $O/env.txt
T=$O/tests.txt
ts "== gpu_turboquant" >> $T; timeout 150 ./gpu_turboquant --include-ignored --test-threads=1 > $O/gpu_turboquant.log 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|SKIPPED|skipped" $O/gpu_turboquant.log >> $T; grep -A2 panicked $O/gpu_turboquant.log >> $T
grep -E "^k2-v2|^k3\+qjl-v2|^k2\+qjl-v2" $O/gpu_turboquant.log | grep " d 128" | cut -c1-230 > $O/d128_crumb_keys.txt
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

date -u >> $O/env.txt
python3 summarize.py $O/tq.txt > $O/summary.txt
cp run.sh summarize.py COMMIT $O/; tar czf $OUT/d22call2.tgz -C $OUT r
cat $O/env.txt; grep -E "==|result|rc=|FAILED|panicked|Invalid|Race" $T
grep -v Warning $O/sdpa.txt | tail -4
wc -l $O/d128_crumb_keys.txt; sort -t' ' -k1,1 $O/d128_crumb_keys.txt | awk '{print $1}' | uniq -c
grep -m2 copy $O/tq.txt; cat $O/summary.txt
