#!/bin/bash
# issue-11-prefill10 device call 1: main's fast prefill (bench_main: the round-9 kernel, SASS
# identical to main 59bf24b's) and this branch's (bench_new) interleaved, uniform and LLM-like
# inputs; SDPA (cuDNN, flash) on the same shapes; the sanitizers and the fast-prefill tests of
# the new test binary (the changed one first), the rest as time allows.
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
SH="4 4096 1 16384 1 32768 --only fast --inputs both"
for k in main new; do timeout 25 ./bench_$k $SH > $W/bench_${k}_1.txt 2>&1; echo "bench $k 1 rc=$? t=$(el)" >> $W/info.txt; done
timeout 25 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
{ timeout 10 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 10 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
for t in gpu_turbo_fast_prefill_matches_its_twin gpu_turbo_fast_prefill_q_tiles_are_the_prologue_codes gpu_turbo_prefill_kernel_choice gpu_turbo_nvrtc_equals_fatbin gpu_turbo_prefill_is_bit_exact_with_sas; do
  left=$(( 112 - $(el) )); [ $left -lt 5 ] && break
  timeout $left ./gpu_turbo_new $t --exact --include-ignored --test-threads=1 --nocapture >> $W/tests_new.txt 2>&1; echo "test $t rc=$? t=$(el)" >> $W/info.txt
done
cd $W && tar czf $OUT/results1.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results1.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_1 bench_new_1; do echo $f; sed 's/ TFLOP.*//' $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; cd $OUT && rm -rf s
