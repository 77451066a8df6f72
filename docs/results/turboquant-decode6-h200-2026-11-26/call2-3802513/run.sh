#!/bin/bash
# issue-10-decode6, call 2 (tqdecode_new = 144 registers, stacked S q, driver's carveout): GPU tests + sanitizers on this branch's build; the TurboQuant decode of
# main's binary (cf7f54e) and this branch's, interleaved twice (and the branch at main's width,
# --units 1584 = 3 CTAs of 4 warps per SM, at >= 1 GB; one 8-warp CTA per SM at batch 1); SDPA + copy ceiling; ncu of the decode.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d6
tar xJf bins.tar.xz || exit 3
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
echo "== gpu_turboquant" >> $T; timeout 70 ./gpu_turboquant --include-ignored --test-threads=1 > $OUT/gpu_turboquant.log 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|SKIPPED|assert|left|right" $OUT/gpu_turboquant.log >> $T
echo "== gpu_device_api turboquant" >> $T; timeout 30 ./gpu_device_api turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|SKIPPED|assert" >> $T
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 35 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool gpu_turboquant_sanitizer_small rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done
cat $OUT/env.txt; cat $T; echo "tests done at $SECONDS s"
run() { echo "-- $*"; timeout 20 "$@" 2>&1 | grep -E "turboquant|error"; }
{
for rep in 1 2; do
  for s in "1 32768 --sets 4" "1 16384 --sets 4" "1 131072 --sets 2" "16 16384 --sets 2" "32 32768"; do
    run ./tqdecode_main $s --config k4q-v3,k4-v3
    run ./tqdecode_new $s --config k4q-v3,k4-v3
  done
  for s in "1 32768 --sets 4" "1 16384 --sets 4"; do
    echo "-- FERRATTN_TQ_UNIT_WARPS=8 --units 1056"; FERRATTN_TQ_UNIT_WARPS=8 run ./tqdecode_new $s --config k4q-v3 --units 1056
  done
done
} > $OUT/tq-timing.txt 2>&1
grep -E "^--|k4q" $OUT/tq-timing.txt | paste - - | sed 's/turboquant //' | cut -c1-170; echo "timing done at $SECONDS s"
timeout 50 python3 bench_sdpa.py jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "sdpa rc=$?" >> $T; grep -v Warning $OUT/tq-sdpa.txt | tail -7
for bin in tqdecode_main tqdecode_new; do for s in "16 16384"; do
  [ $SECONDS -gt 170 ] && { echo "== ncu $bin $s skipped (time: $SECONDS s)" >> $OUT/ncu.txt; continue; }
  echo "== ncu $bin $s [$SECONDS s]" >> $OUT/ncu.txt
  timeout 12 ncu --clock-control none -k "regex:turboquant_decode" -c 1 --metrics "gpu__time_duration.sum,smsp__inst_executed.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed" ./$bin $s --sets 1 --config k4q-v3 --iters 1 >> $OUT/ncu.txt 2>&1
done; done
grep -E "^==|turboquant_|duration|inst_executed|registers|grid_size|block_size|issue_active|warps_active|occupancy|dram__" $OUT/ncu.txt | head -40
tail -1 $T; echo "all done at $SECONDS s"
