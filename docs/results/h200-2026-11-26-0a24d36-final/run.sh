#!/bin/bash
# Final verification of the merged tip (tenth session): every GPU test binary, sanitizers, the Python tests from
# the installed abi3 wheel, lean_paged, the Lean table, and the TurboQuant decode of the merged tree against
# main 11cca13's binary with SDPA and the copy ceiling in the same call.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-f10
{ date; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
for t in gpu_lean gpu_device_api gpu_turboquant gpu_turbo; do
  echo "== $t" >> $T; timeout 220 ./$t --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|SKIPPED|assert|left|right" >> $T
done
for pair in "gpu_turbo gpu_turbo_sanitizer_small" "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_lean lean_device::gpu_device_sanitizer_small" "gpu_lean gpu_sanitizer_small_grid"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
cat $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked|SKIPPED" $T
rm -rf /tmp/site-f10; python3 -m pip install -q --no-index --no-deps --target /tmp/site-f10 wheels/*.whl > /dev/null 2>&1
R=$(cd "$B/.." && pwd); (cd /tmp && PYTHONPATH=/tmp/site-f10 timeout 170 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $T)
tail -3 $OUT/pytest.log
timeout 60 ./lean_paged --quick > $OUT/lean_paged.txt 2>&1; cat $OUT/lean_paged.txt
run() { echo "-- $*"; timeout 60 "$@" 2>&1 | grep -E "turboquant|error"; }
{
for rep in 1 2; do
  for s in "1 32768 --sets 6" "1 131072 --sets 2" "16 16384 --sets 2" "64 4096" "32 32768"; do
    run ./tqdecode_main $s --config k4q-v3,k4-v3
    run ./tqdecode_new $s --config k4q-v3,k4-v3
  done
done
} > $OUT/tq-timing.txt 2>&1
cat $OUT/tq-timing.txt
timeout 90 python3 bench_sdpa.py jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "sdpa rc=$?" >> $T; grep -v Warning $OUT/tq-sdpa.txt | tail -12
tail -3 $T
