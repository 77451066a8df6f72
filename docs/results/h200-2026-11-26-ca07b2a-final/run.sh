#!/bin/bash
# Final verification of the merged tip (eleventh session): GPU tests of the merged TurboQuant (decode4 + compress2),
# the TurboAttention prefill (chunks) and the device API (Lean paged cp.async words), sanitizers, the Python
# TurboQuant tests from the installed abi3 wheel, and the TurboQuant decode of the tip against main 42f5a1a's
# binary with SDPA and the copy ceiling in the same call.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-f11
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
echo "== gpu_turboquant" >> $T; timeout 100 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_turbo (--skip nvrtc)" >> $T; timeout 100 ./gpu_turbo --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for pair in "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
cat $OUT/env.txt; grep -E "==|result|rc=|FAILED|panicked" $T
rm -rf /tmp/site-f11; python3 -m pip install -q --no-index --no-deps --target /tmp/site-f11 wheels/*.whl > /dev/null 2>&1
R=$(cd "$B/.." && pwd); (cd /tmp && PYTHONPATH=/tmp/site-f11 timeout 90 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests -k "turboquant or paged" > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $T)
tail -3 $OUT/pytest.log
run() { echo "-- $*"; timeout 25 "$@" 2>&1 | grep -E "turboquant|error"; }
{
for rep in 1 2; do
  for s in "1 32768 --sets 4" "1 131072 --sets 2" "16 16384 --sets 2" "64 4096" "32 32768"; do
    run ./tqdecode_main $s --config k4q-v3,k4-v3
    run ./tqdecode_new $s --config k4q-v3,k4-v3
  done
done
} > $OUT/tq-timing.txt 2>&1
grep -E "^--|k4q" $OUT/tq-timing.txt | paste - - | sed 's/turboquant //' | cut -c1-170
timeout 50 python3 bench_sdpa.py jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "sdpa rc=$?" >> $T; grep -v Warning $OUT/tq-sdpa.txt | tail -7
tail -2 $T
