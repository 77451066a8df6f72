#!/bin/bash
# issue-11-prefill11 device call 1. bench_main: issue-11-prefill10's bench_new (55595e5), whose
# turbo_prefill.cu / common.cuh / turbo.rs are main bef35d4's. bench_tl: f3e1d17 (the timeline
# hooks; shipped kernel = main's SASS but the trace stride). bench_new / gpu_turbo_new: the
# branch's candidate (early producer copies). Interleaved main/new twice, the instrumented
# timeline (bench_tl --nvrtc with FERRATTN_WGF_TIMELINE), the 10-word trace of the shipped
# kernels of tl and new at 4 x 4096, SDPA, sanitizers and prefill tests of gpu_turbo_new.
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W/tl $W/tr_tl $W/tr_new
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
SH="4 4096 1 16384 1 32768 --only fast --inputs both"
timeout 25 ./bench_main $SH > $W/bench_main_1.txt 2>&1; echo "bench main 1 rc=$? t=$(el)" >> $W/info.txt
timeout 25 ./bench_new $SH > $W/bench_new_1.txt 2>&1; echo "bench new 1 rc=$? t=$(el)" >> $W/info.txt
export FERRATTN_CACHE_DIR=/tmp/fc
FERRATTN_WGF_TRACE=1 FERRATTN_NVRTC_DEFINES=-DFERRATTN_WGF_TIMELINE=1 timeout 45 ./bench_tl 4 4096 1 16384 1 32768 --only fast --nvrtc --trace $W/tl > $W/timeline_bench.txt 2>&1; echo "timeline rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_TRACE=1 timeout 10 ./bench_tl 4 4096 --only fast --trace $W/tr_tl > $W/trace_tl_bench.txt 2>&1; echo "trace tl rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_TRACE=1 timeout 10 ./bench_new 4 4096 --only fast --trace $W/tr_new > $W/trace_new_bench.txt 2>&1; echo "trace new rc=$? t=$(el)" >> $W/info.txt
python3 timeline.py $W/tl/*.bin > $W/timeline_summary.md 2>&1
timeout 25 ./bench_new $SH > $W/bench_new_2.txt 2>&1; echo "bench new 2 rc=$? t=$(el)" >> $W/info.txt
timeout 25 ./bench_main $SH > $W/bench_main_2.txt 2>&1; echo "bench main 2 rc=$? t=$(el)" >> $W/info.txt
timeout 16 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
{ timeout 10 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 10 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
for t in gpu_turbo_fast_prefill_matches_its_twin gpu_turbo_fast_prefill_q_tiles_are_the_prologue_codes gpu_turbo_prefill_kernel_choice gpu_turbo_prefill_is_bit_exact_with_sas; do
  left=$(( 158 - $(el) )); [ $left -lt 4 ] && break
  timeout $left ./gpu_turbo_new $t --exact --include-ignored --test-threads=1 --nocapture >> $W/tests_new.txt 2>&1; echo "test $t rc=$? t=$(el)" >> $W/info.txt
done
cd $W && tar czf $OUT/results1.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results1.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head -20; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_1 bench_new_1 bench_new_2 bench_main_2 timeline_bench; do echo $f; sed 's/ TFLOP.*//' $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; cat timeline_summary.md; cd $OUT && rm -rf s
