#!/bin/bash
# issue-11-prefill9 device call: main's fast prefill (bench_main: dcc6bd1's kernel with this
# branch's bench) and this branch's (bench_new) interleaved, twice, uniform and LLM-like inputs;
# SDPA (cuDNN, flash) on the same shapes; the prefill tests (NVRTC included) and the sanitizers
# of the new test binary; ncu of the new kernel at 4 x 4096 non-causal if time is left.
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
SH="4 4096 1 16384 1 32768 --only fast --inputs both"
for k in main new; do timeout 30 ./bench_$k $SH > $W/bench_${k}_1.txt 2>&1; echo "bench $k 1 rc=$? t=$(el)" >> $W/info.txt; done
timeout 30 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
timeout 75 ./gpu_turbo_new prefill nvrtc --include-ignored --test-threads=1 --nocapture > $W/tests_new.txt 2>&1; echo "tests new rc=$? t=$(el)" >> $W/info.txt
{ timeout 15 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 15 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
if [ $(el) -lt 118 ]; then for k in new main; do timeout 28 ./bench_$k $SH > $W/bench_${k}_2.txt 2>&1; echo "bench $k 2 rc=$? t=$(el)" >> $W/info.txt; done; fi
SEC="--section SpeedOfLight --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
if [ $(el) -lt 152 ]; then timeout 12 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC ./bench_new 4 4096 --only fast --causal no > $W/ncu_new_4k.txt 2>&1; echo "ncu new rc=$? t=$(el)" >> $W/info.txt; fi
cd $W && tar czf $OUT/results.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_1 bench_new_1 bench_new_2 bench_main_2; do echo $f; sed 's/ TFLOP.*//' $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; grep -h 'Executed Instructions  \|Duration\|Issue Slots Busy\|No Eligible' ncu_*.txt; cd $OUT && rm -rf s
