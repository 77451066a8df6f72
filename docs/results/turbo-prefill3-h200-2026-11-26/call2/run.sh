#!/bin/bash
# issue-11-prefill3 device call 2: fast prefill of main (bench_main, 59e18fa tree = v3), call 1's
# persistent static kernel (bench_c1, 2nd commit of the branch), and d2c4820 (bench_c2: dynamic
# items, split pre-pass) plain / ping-pong / grouped items / both; SDPA; tests + sanitizer +
# device-path test of c2; ncu of c2; benches again.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; } > $W/info.txt
SH="4 1024 4 4096 1 16384 1 32768 --only fast"
bench() { # tag, env..., binary
  local tag=$1 bin=$2; shift 2
  env "$@" timeout 20 ./$bin $SH > $W/bench_${tag}_$R.txt 2>&1; echo "bench $tag $R rc=$? t=$(el)" >> $W/info.txt
}
round() {
  bench main bench_main X=1; bench c1 bench_c1 X=1; bench c2 bench_c2 X=1
  bench c2pp bench_c2 FERRATTN_WGF_PINGPONG=1; bench c2g bench_c2 FERRATTN_WGF_ORDER=group
  bench c2gpp bench_c2 FERRATTN_WGF_ORDER=group FERRATTN_WGF_PINGPONG=1
}
R=1; round
timeout 60 python3 bench_sdpa.py jobs.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
timeout 85 ./gpu_turbo_c2 prefill nvrtc --include-ignored --test-threads=1 --nocapture > $W/tests_c2.txt 2>&1; echo "tests c2 rc=$? t=$(el)" >> $W/info.txt
{ timeout 30 compute-sanitizer --tool memcheck ./gpu_turbo_c2 gpu_turbo_sanitizer_small --include-ignored; timeout 40 compute-sanitizer --tool racecheck ./gpu_turbo_c2 gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_c2.txt 2>&1; echo "sanitizer c2 t=$(el)" >> $W/info.txt
{ FERRATTN_WGF_ORDER=group timeout 40 ./gpu_turbo_c2 gpu_turbo_fast_prefill --include-ignored --test-threads=1 --nocapture; FERRATTN_WGF_ORDER=group FERRATTN_WGF_PINGPONG=1 timeout 40 ./gpu_turbo_c2 gpu_turbo_fast_prefill --include-ignored --test-threads=1 --nocapture; FERRATTN_WGF_ORDER=group FERRATTN_WGF_PINGPONG=1 timeout 20 compute-sanitizer --tool racecheck ./gpu_turbo_c2 gpu_turbo_sanitizer_small --include-ignored; } > $W/tests_c2g.txt 2>&1; echo "tests c2g rc=$? t=$(el)" >> $W/info.txt
timeout 40 ./gpu_device_api_c2 gpu_turbo_cache --include-ignored --test-threads=1 --nocapture > $W/tests_device_api_c2.txt 2>&1; echo "device api c2 rc=$? t=$(el)" >> $W/info.txt
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats"
prof() { # name, binary, args...
  local n=$1; shift
  timeout 30 ncu --clock-control none -k regex:turbo_prefill_wgf -s 2 -c 1 $SEC -o $W/ncu_$n "$@" > $W/ncu_$n.log 2>&1
  echo "ncu $n rc=$? t=$(el)" >> $W/info.txt
  ncu -i $W/ncu_$n.ncu-rep --print-details all > $W/ncu_$n.txt 2>&1
  ncu -i $W/ncu_$n.ncu-rep --page raw --csv > $W/ncu_${n}_raw.csv 2>&1
}
if [ $(el) -lt 200 ]; then prof c2_16k_nc ./bench_c2 1 16384 --only fast --causal no; fi
if [ $(el) -lt 210 ]; then prof c2_1k_nc ./bench_c2 4 1024 --only fast --causal no; fi
R=2; if [ $(el) -lt 215 ]; then round; fi
cd $W && tar czf $OUT/results.tgz . && ls -la $OUT
