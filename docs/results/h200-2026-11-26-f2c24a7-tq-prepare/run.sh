#!/bin/bash
# Verification of the merged prepare dispatch (Auto): tests, sanitizers, timing against 0a24d36's binary, SDPA.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
echo "== gpu_turboquant" >> $T; timeout 120 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_device_api" >> $T; timeout 120 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool gpu_turboquant_sanitizer_small rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done
cat $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked" $T
run() { echo "-- $*"; timeout 60 "$@" 2>&1 | grep -E "turboquant|error"; }
{ for rep in 1 2; do for s in "1 32768 --sets 6" "1 131072 --sets 2" "2 32768 --sets 4" "16 16384 --sets 2" "64 4096" "32 32768"; do
  run ./tqdecode_main $s --config k4q-v3,k4-v3; run ./tqdecode_new $s --config k4q-v3,k4-v3; done; done; } > $OUT/tq-timing.txt 2>&1
grep -E "^--|k4q" $OUT/tq-timing.txt
timeout 90 python3 bench_sdpa.py jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; grep -v Warning $OUT/tq-sdpa.txt | tail -7
