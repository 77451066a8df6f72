#!/bin/bash
# issue-11-prefill5 device call 1: main's fast prefill (bench_main, 0ca50bd) vs this branch's
# (bench_new: Q blocks grouped over the KV head's query heads, trip-major order for causal)
# interleaved, twice; the order override on the same binary; SDPA (cuDNN, flash); the prefill
# tests + sanitizers of the new binary; a per-CTA trace and ncu of the new kernel.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; ncu --version | tail -1; cat COMMIT 2>/dev/null; } > $W/info.txt
SH="4 1024 4 4096 1 16384 1 32768 --only fast"
timeout 30 ./bench_main $SH > $W/bench_main_1.txt 2>&1; echo "bench main rc=$? t=$(el)" >> $W/info.txt
timeout 30 ./bench_new $SH > $W/bench_new_1.txt 2>&1; echo "bench new rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_ORDER=head timeout 20 ./bench_new $SH --causal yes > $W/bench_new_head_1.txt 2>&1; echo "bench new head rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_ORDER=trip timeout 20 ./bench_new $SH --causal no > $W/bench_new_trip_1.txt 2>&1; echo "bench new trip rc=$? t=$(el)" >> $W/info.txt
timeout 60 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
timeout 100 ./gpu_turbo_new prefill nvrtc --include-ignored --test-threads=1 --nocapture > $W/tests_new.txt 2>&1; echo "tests new rc=$? t=$(el)" >> $W/info.txt
{ timeout 30 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 40 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
mkdir -p $W/trace
FERRATTN_WGF_TRACE=1 timeout 30 ./bench_new 4 1024 4 4096 1 16384 --only fast --trace $W/trace > $W/bench_trace.txt 2>&1; echo "trace rc=$? t=$(el)" >> $W/info.txt
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats"
prof() { # name, binary, args...
  local n=$1; shift
  timeout 40 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC -o $W/ncu_$n "$@" > $W/ncu_$n.log 2>&1
  echo "ncu $n rc=$? t=$(el)" >> $W/info.txt
  ncu -i $W/ncu_$n.ncu-rep --print-details all > $W/ncu_$n.txt 2>&1
  ncu -i $W/ncu_$n.ncu-rep --page raw --csv > $W/ncu_${n}_raw.csv 2>&1
  rm -f $W/ncu_$n.ncu-rep
}
if [ $(el) -lt 170 ]; then prof new_4k_nc ./bench_new 4 4096 --only fast --causal no; fi
if [ $(el) -lt 180 ]; then prof new_4k_c ./bench_new 4 4096 --only fast --causal yes; fi
if [ $(el) -lt 200 ]; then for k in new main; do timeout 15 ./bench_$k $SH > $W/bench_${k}_2.txt 2>&1; echo "bench $k 2 rc=$? t=$(el)" >> $W/info.txt; done; fi
cd $W && tar czf $OUT/results.tgz . && ls -la $OUT
echo "---- summary"; cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_1 bench_new_1 bench_new_head_1 bench_new_trip_1 bench_new_2 bench_main_2; do echo $f; cat $f.txt; done; ls -la trace; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"
