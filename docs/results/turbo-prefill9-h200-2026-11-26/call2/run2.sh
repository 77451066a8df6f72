#!/bin/bash
# issue-11-prefill9 device call 2: the same binaries as call 1; the benches again in the other
# order (new first), 4 x 1024 (the chunk path) added, SDPA again (4 x 1024 added), the two
# prefill tests call 1's 75 s limit cut (the wg and mma.sync kernels against the emulation, SAS
# off and thresholds), ncu of main's kernel at 4 x 4096 non-causal (call 1 profiled the new one).
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
SH="4 4096 1 16384 1 32768 --only fast --inputs both"
for k in new main; do timeout 30 ./bench_$k $SH > $W/bench_${k}_2.txt 2>&1; echo "bench $k 2 rc=$? t=$(el)" >> $W/info.txt; done
for k in new main; do timeout 10 ./bench_$k 4 1024 --only fast > $W/bench_${k}_1k.txt 2>&1; echo "bench $k 1k rc=$? t=$(el)" >> $W/info.txt; done
timeout 30 python3 bench_sdpa.py jobs2.json $W/sdpa2.json 2> $W/sdpa2_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
timeout 70 ./gpu_turbo_new gpu_turbo_prefill_matches_the_emulation gpu_turbo_prefill_sas_off_and_thresholds --include-ignored --test-threads=1 --nocapture > $W/tests_new_2.txt 2>&1; echo "tests new 2 rc=$? t=$(el)" >> $W/info.txt
SEC="--section SpeedOfLight --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
if [ $(el) -lt 150 ]; then timeout 12 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC ./bench_main 4 4096 --only fast --causal no > $W/ncu_main_4k.txt 2>&1; echo "ncu main rc=$? t=$(el)" >> $W/info.txt; fi
cd $W && tar czf $OUT/results2.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results2.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked\|^test ' tests_new_2.txt | cut -c1-150 | head -20; for f in bench_new_2 bench_main_2 bench_new_1k bench_main_1k; do echo $f; sed 's/ TFLOP.*//' $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa2.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; grep -h 'Executed Instructions  \|Duration\|Issue Slots Busy\|No Eligible' ncu_*.txt; cd $OUT && rm -rf s
