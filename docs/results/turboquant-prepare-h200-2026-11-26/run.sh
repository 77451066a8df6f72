#!/bin/bash
# issue-10-prepare: GPU tests (incl. the v1-prepare bit-identity asserts), sanitizers, and the TurboQuant
# decode of main's binary (0a24d36 = main 753ca4e's code) and this branch's, interleaved twice, + SDPA.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p10c
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
echo "== gpu_turboquant" >> $T; timeout 70 ./gpu_turboquant --include-ignored --test-threads=1 > $OUT/gpu_turboquant.log 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|SKIPPED|assert|left|right" $OUT/gpu_turboquant.log >> $T
echo "== gpu_device_api turboquant" >> $T; timeout 30 ./gpu_device_api turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|SKIPPED|assert" >> $T
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool gpu_turboquant_sanitizer_small rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done
cat $OUT/env.txt; cat $T
run() { echo "-- $*"; timeout 25 "$@" 2>&1 | grep -E "turboquant|error"; }
{
for rep in 1 2; do
  for s in "1 32768 --sets 6" "1 131072 --sets 2" "16 16384 --sets 2" "64 4096"; do
    run ./tqdecode_main $s --config k4q-v3,k4-v3
    run ./tqdecode_new $s --config k4q-v3,k4-v3
  done
  echo "-- FERRATTN_TQ_PREPARE=v1 (this branch's binary, the old prepare kernel)"
  FERRATTN_TQ_PREPARE=v1 run ./tqdecode_new 1 32768 --sets 6 --config k4q-v3,k4-v3
done
} > $OUT/tq-timing.txt 2>&1
cat $OUT/tq-timing.txt
timeout 50 python3 bench_sdpa.py jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "sdpa rc=$?" >> $T; grep -v Warning $OUT/tq-sdpa.txt | tail -12
tail -1 $T
# the prepare kernel alone, at real clocks, warm caches (as the fifth pass's table): 4 launches each
for bin in tqdecode_main tqdecode_new; do
  echo "== ncu $bin" >> $OUT/ncu.txt
  timeout 25 ncu --clock-control none --cache-control none -k regex:prepare -c 4 --metrics gpu__time_duration.sum,launch__grid_size,smsp__inst_executed.sum,smsp__warps_launched.sum ./$bin 1 32768 --sets 1 --config k4q-v3 >> $OUT/ncu.txt 2>&1
done
grep -E "==|prepare|duration|grid_size|inst_executed|warps_launched" $OUT/ncu.txt | head -60
