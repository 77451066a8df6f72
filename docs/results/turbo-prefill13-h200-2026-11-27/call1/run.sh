#!/bin/bash
# issue-11-prefill13 (helper, seventeenth session): TurboAttention prefill round 13, a persistent CTA per SM
# (turbo_prefill_wgfp_*, a measurement kernel with the INT32 path only, FERRATTN_WGF_PERSIST=1).
# bench_main: main a005076's turbo_prefill (/work/base-bins17). bench_new / gpu_turbo_new: the branch;
# p0 = the branch with the default kernel (wgf), p1 = the persistent kernel. Interleaved main, p0, p1,
# SDPA, p1, p0, main; then sanitizers and tests.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p13
mkdir -p $FERRATTN_CACHE_DIR
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$OUT/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $I
SH="4 4096 1 16384 1 32768 --causal both --only fast"
bm() { timeout 25 ./bench_main $SH > $OUT/bench_main_$1.txt 2>&1; echo "bench main $1 rc=$? t=$(el)" >> $I; }
bn() { FERRATTN_WGF_PERSIST=$1 timeout 25 ./bench_new $SH > $OUT/bench_p$1_$2.txt 2>&1; echo "bench p$1 $2 rc=$? t=$(el)" >> $I; }
bm 1; bn 0 1; bn 1 1
timeout 30 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $OUT/sdpa.json > $OUT/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
bn 1 2; bn 0 2; bm 2
S=$OUT/tests.txt
for tool in memcheck racecheck; do
  FERRATTN_WGF_PERSIST=2 timeout 20 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_fast_prefill_persistent_rows --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "persist 2 persistent_rows $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) t=$(el)" >> $S; cp /tmp/san.txt $OUT/san_p2_$tool.txt
  timeout 15 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "default sanitizer_small $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) t=$(el)" >> $S
done
for pv in 0 2; do
  FERRATTN_WGF_PERSIST=$pv timeout 30 ./gpu_turbo_new gpu_turbo_fast_prefill_persistent_rows --exact --include-ignored --test-threads=1 --nocapture > $OUT/t_rows_p$pv.txt 2>&1; echo "persistent_rows persist $pv rc=$? t=$(el)" >> $S
done
left=$(( 150 - $(el) )); [ $left -ge 5 ] && { timeout $left ./gpu_turbo_new gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 --nocapture > $OUT/t_twin.txt 2>&1; echo "twin (default) rc=$? t=$(el)" >> $S; }
left=$(( 175 - $(el) )); [ $left -ge 8 ] && { for k in main 1 0; do
  if [ $k = main ]; then timeout 8 ./bench_main 4 1024 --causal both --only fast > $OUT/bench_1k_main.txt 2>&1;
  else FERRATTN_WGF_PERSIST=$k timeout 8 ./bench_new 4 1024 --causal both --only fast > $OUT/bench_1k_p$k.txt 2>&1; fi
  echo "bench 4x1024 $k rc=$? t=$(el)" >> $S; done; }
cat $I $S; for f in $OUT/bench_*; do echo "$(basename $f)"; grep -o "[0-9]* x [0-9]* causal [a-z]* fast: [0-9.]* ms total" $f; done
grep -h "persistent rows\|test result\|panicked" $OUT/t_rows_p*.txt; grep -h "test result\|FAILED\|panicked" $OUT/t_twin.txt
