#!/bin/bash
# issue-11-prefill7 device call: main's fast prefill (bench_main, 4903ce5) and this branch's
# (bench_new) interleaved, twice; SDPA (cuDNN, flash); the prefill tests + sanitizers of the new
# binary; ncu of both at 4 x 4096 non-causal (executed instructions, issue, stalls).
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; ncu --version | tail -1; cat COMMIT; } > $W/info.txt
SH="4 1024 4 4096 1 16384 1 32768 --only fast"
for k in main new; do timeout 25 ./bench_$k $SH > $W/bench_${k}_1.txt 2>&1; echo "bench $k 1 rc=$? t=$(el)" >> $W/info.txt; done
timeout 50 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
timeout 75 ./gpu_turbo_new prefill nvrtc --include-ignored --test-threads=1 --nocapture > $W/tests_new.txt 2>&1; echo "tests new rc=$? t=$(el)" >> $W/info.txt
{ timeout 25 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 30 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats"
prof() { # name, binary, args...
  local n=$1; shift
  timeout 25 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC -o $W/ncu_$n "$@" > $W/ncu_$n.log 2>&1
  echo "ncu $n rc=$? t=$(el)" >> $W/info.txt
  ncu -i $W/ncu_$n.ncu-rep --print-details all > $W/ncu_$n.txt 2>&1
  rm -f $W/ncu_$n.ncu-rep
}
if [ $(el) -lt 125 ]; then prof new_4k ./bench_new 4 4096 --only fast --causal no; fi
if [ $(el) -lt 135 ]; then prof main_4k ./bench_main 4 4096 --only fast --causal no; fi
if [ $(el) -lt 150 ]; then for k in new main; do timeout 12 ./bench_$k $SH > $W/bench_${k}_2.txt 2>&1; echo "bench $k 2 rc=$? t=$(el)" >> $W/info.txt; done; fi
cd $W && tar czf $OUT/results.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_1 bench_new_1 bench_new_2 bench_main_2; do echo $f; cat $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; grep -h 'Executed Instructions  \|Duration\|Issue Slots Busy\|No Eligible\|Eligible Warps Per' ncu_*.txt; cd $OUT && rm -rf s
