#!/bin/bash
# issue-10-decode5, call 1 (09:39 UTC, H200): GPU tests + sanitizers on this branch's build; the TurboQuant decode of main's binary
# (0ca50bd) and this branch's, interleaved twice; batch-1 unit/warp sweep; SDPA + copy ceiling; ncu of the decode.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d5
tar xJf bins.tar.xz || exit 3
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
echo "== gpu_turboquant" >> $T; timeout 80 ./gpu_turboquant --include-ignored --test-threads=1 > $OUT/gpu_turboquant.log 2>&1; echo "rc=$?" >> $T
grep -E "^test |test result|panicked|SKIPPED|assert|left|right" $OUT/gpu_turboquant.log >> $T
echo "== gpu_device_api turboquant" >> $T; timeout 40 ./gpu_device_api turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|SKIPPED|assert" >> $T
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 45 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant gpu_turboquant_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool gpu_turboquant_sanitizer_small rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done
cat $OUT/env.txt; cat $T
run() { echo "-- $*"; timeout 25 "$@" 2>&1 | grep -E "turboquant|error"; }
{
for rep in 1 2; do
  for s in "1 32768 --sets 4" "1 16384 --sets 4" "2 32768 --sets 2" "1 131072 --sets 2" "16 16384 --sets 2" "64 4096" "32 32768"; do
    run ./tqdecode_main $s --config k4q-v3,k4-v3
    run ./tqdecode_new $s --config k4q-v3,k4-v3
  done
done
for wu in "4 924" "4 1188" "7 660" "7 792" "7 924"; do set -- $wu
  echo "-- FERRATTN_TQ_UNIT_WARPS=$1 --units $2"; FERRATTN_TQ_UNIT_WARPS=$1 run ./tqdecode_new 1 32768 --sets 4 --units $2 --config k4q-v3
done
for wu in "4 660" "7 462" "7 660" "7 924"; do set -- $wu
  echo "-- FERRATTN_TQ_UNIT_WARPS=$1 --units $2"; FERRATTN_TQ_UNIT_WARPS=$1 run ./tqdecode_new 1 16384 --sets 4 --units $2 --config k4q-v3
done
for wu in "7 924" "4 1188"; do set -- $wu
  echo "-- FERRATTN_TQ_UNIT_WARPS=$1 --units $2"; FERRATTN_TQ_UNIT_WARPS=$1 run ./tqdecode_new 2 32768 --sets 2 --units $2 --config k4q-v3
done
} > $OUT/tq-timing.txt 2>&1
grep -E "^--|k4q" $OUT/tq-timing.txt | paste - - | sed 's/turboquant //' | cut -c1-160
timeout 60 python3 bench_sdpa.py jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "sdpa rc=$?" >> $T; grep -v Warning $OUT/tq-sdpa.txt | tail -9
for bin in tqdecode_main tqdecode_new; do for s in "16 16384" "1 32768"; do
  [ $SECONDS -gt 215 ] && { echo "== ncu $bin $s skipped (time: $SECONDS s)" >> $OUT/ncu.txt; continue; }
  echo "== ncu $bin $s [$SECONDS s]" >> $OUT/ncu.txt
  timeout 25 ncu --clock-control none -k regex:turboquant_decode -c 1 --metrics "gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,launch__grid_size,launch__block_size,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" ./$bin $s --sets 1 --config k4q-v3 --iters 2 >> $OUT/ncu.txt 2>&1
done; done
grep -vE "^==PROF==|^turboquant B=" $OUT/ncu.txt | awk '/^==|turboquant_|ERR|duration|inst_executed|registers|grid_size|block_size|issue_active|dram__/ || ($NF+0 >= 0.1 && /stalled/)' | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -80
tail -1 $T
