#!/bin/bash
# issue-11-prefill12 (helper, sixteenth session): TurboAttention prefill round 12, the consumer warpgroups
# started out of phase (PrefillParams::stagger; FERRATTN_WGF_STAGGER 0 together, 1 after the first S
# (the branch default), 2 after the first tile's codes). bench_main: main 1eb66ef's turbo_prefill (the
# lead's /work/base-bins). bench_new / gpu_turbo_new: the branch. Interleaved main / new (1, 2, 0 once),
# twice, SDPA (cuDNN, flash) in the same call, then sanitizers and the prefill tests.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p12
mkdir -p $FERRATTN_CACHE_DIR
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$OUT/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $I
SH="4 4096 1 16384 1 32768 --causal both --only fast"
bm() { timeout 25 ./bench_main $SH > $OUT/bench_main_$1.txt 2>&1; echo "bench main $1 rc=$? t=$(el)" >> $I; }
bn() { FERRATTN_WGF_STAGGER=$1 timeout 25 ./bench_new $SH > $OUT/bench_s$1_$2.txt 2>&1; echo "bench s$1 $2 rc=$? t=$(el)" >> $I; }
bm 1; bn 1 1; bn 2 1; bn 0 1
timeout 25 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $OUT/sdpa.json > $OUT/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
bn 2 2; bn 1 2; bm 2
S=$OUT/tests.txt
for mt in "1 memcheck" "1 racecheck" "2 racecheck"; do set -- $mt; m=$1; tool=$2
  FERRATTN_WGF_STAGGER=$m timeout 15 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "stagger $m $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) t=$(el)" >> $S
done
for t in gpu_turbo_fast_prefill_matches_its_twin gpu_turbo_fast_prefill_q_tiles_are_the_prologue_codes gpu_turbo_prefill_kernel_choice gpu_turbo_prefill_is_bit_exact_with_sas gpu_turbo_prefill_sas_off_and_thresholds gpu_turbo_prefill_matches_the_emulation; do
  left=$(( 140 - $(el) )); [ $left -lt 5 ] && { echo "skipped $t (time)" >> $S; continue; }
  timeout $left ./gpu_turbo_new $t --exact --include-ignored --test-threads=1 --nocapture > $OUT/t_$t.txt 2>&1; echo "test $t rc=$? t=$(el)" >> $S
done
left=$(( 160 - $(el) )); [ $left -ge 5 ] && { FERRATTN_WGF_STAGGER=2 timeout $left ./gpu_turbo_new gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 --nocapture > $OUT/t_twin_s2.txt 2>&1; echo "twin stagger 2 rc=$? t=$(el)" >> $S; }
cd $OUT && cat t_gpu_turbo_*.txt > tests_out.txt 2>/dev/null; rm -f t_gpu_turbo_*.txt
tar czf $OUT/benches.tgz bench_*.txt && rm -f bench_*.txt
echo ---; cat $I $S; mkdir -p /tmp/s && tar xzf benches.tgz -C /tmp/s && for f in /tmp/s/bench_*; do echo "$(basename $f)"; grep -o "[0-9]* x [0-9]* causal [a-z]* fast: [0-9.]* ms total, [0-9.]* ms attention" $f; done
grep -h "test result\|FAILED\|panicked" tests_out.txt t_twin_s2.txt | sort | uniq -c
