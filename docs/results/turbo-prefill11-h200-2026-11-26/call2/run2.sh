#!/bin/bash
# issue-11-prefill11 device call 2. bench_main: issue-11-prefill10's bench_new (55595e5; turbo_prefill.cu,
# common.cuh, turbo.rs as main bef35d4). bench_new / gpu_turbo_new: the branch (early producer copies,
# scale loads before seqlens, 16-byte O stores). bench_ab: the first two without the stores.
# bench_tlmain / bench_tlnew: main's kernel (f3e1d17) and the branch's, fatbins compiled with
# -DFERRATTN_WGF_TIMELINE=1 (the per-CTA timeline). Interleaved main/new twice, timelines, SDPA,
# sanitizers, prefill tests.
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W/tl_main $W/tl_new
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
SH="4 4096 1 16384 1 32768 --only fast --inputs both"
timeout 25 ./bench_main $SH > $W/bench_main_1.txt 2>&1; echo "bench main 1 rc=$? t=$(el)" >> $W/info.txt
timeout 25 ./bench_new $SH > $W/bench_new_1.txt 2>&1; echo "bench new 1 rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_TRACE=1 timeout 15 ./bench_tlmain 4 4096 1 32768 --only fast --trace $W/tl_main > $W/tl_main_bench.txt 2>&1; echo "timeline main rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_TRACE=1 timeout 15 ./bench_tlnew 4 4096 1 32768 --only fast --trace $W/tl_new > $W/tl_new_bench.txt 2>&1; echo "timeline new rc=$? t=$(el)" >> $W/info.txt
timeout 25 ./bench_new $SH > $W/bench_new_2.txt 2>&1; echo "bench new 2 rc=$? t=$(el)" >> $W/info.txt
timeout 25 ./bench_main $SH > $W/bench_main_2.txt 2>&1; echo "bench main 2 rc=$? t=$(el)" >> $W/info.txt
timeout 15 ./bench_ab 4 4096 1 32768 --only fast --inputs both > $W/bench_ab.txt 2>&1; echo "bench ab rc=$? t=$(el)" >> $W/info.txt
timeout 16 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
{ timeout 10 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 10 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
for t in gpu_turbo_fast_prefill_matches_its_twin gpu_turbo_fast_prefill_q_tiles_are_the_prologue_codes gpu_turbo_prefill_kernel_choice gpu_turbo_prefill_is_bit_exact_with_sas gpu_turbo_prefill_matches_the_emulation gpu_turbo_prefill_sas_off_and_thresholds gpu_turbo_nvrtc_equals_fatbin; do
  left=$(( 143 - $(el) )); [ $left -lt 4 ] && break
  timeout $left ./gpu_turbo_new $t --exact --include-ignored --test-threads=1 --nocapture >> $W/tests_new.txt 2>&1; echo "test $t rc=$? t=$(el)" >> $W/info.txt
done
python3 timeline.py $W/tl_main/*.bin > $W/timeline_main.md 2>&1; python3 timeline.py $W/tl_new/*.bin > $W/timeline_new.md 2>&1
cd $W && tar czf $OUT/results2.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results2.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head -20; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_1 bench_new_1 bench_new_2 bench_main_2 bench_ab tl_main_bench tl_new_bench; do echo $f; sed 's/ TFLOP.*//' $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; cat timeline_main.md timeline_new.md; cd $OUT && rm -rf s
