#!/bin/bash
# issue-11-prefill3 device call 1: main's fast prefill (v3, bench_main = 59e18fa tree) vs the
# persistent wgf (bench_new, 2abd... branch tip) vs the same with the experimental ping-pong
# (FERRATTN_WGF_PINGPONG=1); SDPA; ncu of v3 (1x16k non-causal, 4x4096 causal) and of the new
# kernel (4x4096 causal, and PP); prefill tests + sanitizer of the new binary; benches again.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; ncu --version | tail -1; } > $W/info.txt
SH="4 1024 4 4096 1 16384 1 32768 --only fast"
timeout 30 ./bench_main $SH > $W/bench_main_1.txt 2>&1; echo "bench main rc=$? t=$(el)" >> $W/info.txt
timeout 30 ./bench_new $SH > $W/bench_new_1.txt 2>&1; echo "bench new rc=$? t=$(el)" >> $W/info.txt
FERRATTN_WGF_PINGPONG=1 timeout 30 ./bench_new $SH > $W/bench_pp_1.txt 2>&1; echo "bench pp rc=$? t=$(el)" >> $W/info.txt
timeout 60 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
timeout 80 ./gpu_turbo_new prefill nvrtc --include-ignored --test-threads=1 --nocapture > $W/tests_new.txt 2>&1; echo "tests new rc=$? t=$(el)" >> $W/info.txt
{ timeout 30 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 40 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats"
prof() { # name, binary, args...
  local n=$1; shift
  timeout 40 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC -o $W/ncu_$n "$@" > $W/ncu_$n.log 2>&1
  echo "ncu $n rc=$? t=$(el)" >> $W/info.txt
  ncu -i $W/ncu_$n.ncu-rep --print-details all > $W/ncu_$n.txt 2>&1
  ncu -i $W/ncu_$n.ncu-rep --page raw --csv > $W/ncu_${n}_raw.csv 2>&1
}
prof v3_16k_nc ./bench_main 1 16384 --only fast --causal no
prof v3_4k_c ./bench_main 4 4096 --only fast --causal yes
prof new_4k_c ./bench_new 4 4096 --only fast --causal yes
if [ $(el) -lt 200 ]; then FERRATTN_WGF_PINGPONG=1 prof pp_4k_c ./bench_new 4 4096 --only fast --causal yes; fi
if [ $(el) -lt 215 ]; then { FERRATTN_WGF_PINGPONG=1 timeout 40 ./gpu_turbo_new gpu_turbo_fast_prefill_matches_its_twin --include-ignored --test-threads=1 --nocapture; FERRATTN_WGF_PINGPONG=1 timeout 20 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/tests_pp.txt 2>&1; echo "tests pp rc=$? t=$(el)" >> $W/info.txt; fi
if [ $(el) -lt 245 ]; then for k in new main; do timeout 12 ./bench_$k $SH > $W/bench_${k}_2.txt 2>&1; echo "bench $k 2 t=$(el)" >> $W/info.txt; done; fi
if [ $(el) -lt 262 ]; then FERRATTN_WGF_PINGPONG=1 timeout 12 ./bench_new $SH > $W/bench_pp_2.txt 2>&1; echo "bench pp 2 t=$(el)" >> $W/info.txt; fi
cd $W && tar czf $OUT/results.tgz . && ls -la $OUT
