#!/bin/bash
# issue-11-prefill10 device call 2: the same binaries as call 1; the benches again in the other
# order (new first), SDPA again, the two prefill tests call 1 left (the wg and mma.sync kernels
# against the emulation, SAS off and thresholds), ncu of both fast kernels at 4 x 4096
# non-causal uniform (executed instructions and issue, to see where call 1's 2% went).
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
SH="4 4096 1 16384 1 32768 --only fast --inputs both"
for k in new main; do timeout 25 ./bench_$k $SH > $W/bench_${k}_2.txt 2>&1; echo "bench $k 2 rc=$? t=$(el)" >> $W/info.txt; done
for t in gpu_turbo_prefill_sas_off_and_thresholds gpu_turbo_prefill_matches_the_emulation; do
  left=$(( 72 - $(el) )); [ $left -lt 5 ] && break
  timeout $left ./gpu_turbo_new $t --exact --include-ignored --test-threads=1 --nocapture >> $W/tests_new_2.txt 2>&1; echo "test $t rc=$? t=$(el)" >> $W/info.txt
done
timeout 20 python3 bench_sdpa.py jobs.json $W/sdpa2.json 2> $W/sdpa2_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
SEC="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section InstructionStats"
for k in new main; do if [ $(el) -lt 86 ]; then timeout 9 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC ./bench_$k 4 4096 --only fast --causal no > $W/ncu_${k}_4k.txt 2>&1; echo "ncu $k rc=$? t=$(el)" >> $W/info.txt; fi; done
cd $W && tar czf $OUT/results2.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results2.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new_2.txt | head; for f in bench_new_2 bench_main_2; do echo $f; sed 's/ TFLOP.*//' $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa2.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; for f in ncu_*.txt; do echo $f; grep -h 'Executed Instructions  \|Duration\|Issue Slots Busy\|No Eligible\|SM Frequency' $f; done; cd $OUT && rm -rf s
