#!/bin/bash
# Twelfth session, call 5: the merged tree cf7f54e (issue-10-compress3, issue-10-decode5, issue-11-prefill5 on top of
# the Lean changes): GPU tests, sanitizers, the Python suite from the abi3 wheel with the CLI, and timings of the merged
# binaries with SDPA / the copy ceiling in the same call; lean_paged with the paged instance forced each way.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v12e
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
echo "== gpu_turboquant" >> $T; timeout 120 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_device_api" >> $T; timeout 90 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_turbo" >> $T; timeout 200 ./gpu_turbo --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for pair in "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
grep -E "==|result|rc=|FAILED|panicked" $T
rm -rf /tmp/site-v12e; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v12e wheels/*.whl > /dev/null 2>&1
R=$(cd "$B/.." && pwd); (cd /tmp && FERRATTN_CLI=$B/ferrattn PYTHONPATH=/tmp/site-v12e timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $T)
tail -4 $OUT/pytest.log
M=$OUT/timing.txt
{ for s in "1 32768 --sets 4" "1 16384 --sets 4" "16 16384 --sets 2" "32 32768"; do echo "-- tqdecode $s"; timeout 30 ./tqdecode $s --config k4q-v3,k4-v3 2>&1 | grep -E "turboquant|error"; done
  echo "-- tqcompress"; timeout 60 ./tqcompress --only fast 2>&1 | tail -20
  echo "-- prefill"; timeout 60 ./prefill 4 4096 1 16384 1 32768 --only fast 2>&1 | tail -12; } > $M 2>&1
cat $M
timeout 60 python3 bench_sdpa.py tq-jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "tq sdpa rc=$?"; grep -v Warning $OUT/tq-sdpa.txt | tail -8
timeout 60 python3 bench_sdpa.py prefill-jobs.json $OUT/prefill-sdpa.json > $OUT/prefill-sdpa.txt 2>&1; echo "prefill sdpa rc=$?"; grep -v Warning $OUT/prefill-sdpa.txt | tail -8
P=$OUT/paged.txt
for a in grid always never; do echo "== --ahead $a" >> $P; if [ $a = grid ]; then timeout 60 ./lean_paged >> $P 2>&1; else timeout 60 ./lean_paged --ahead $a >> $P 2>&1; fi; done
cat $P
