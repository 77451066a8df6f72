#!/bin/bash
# Twelfth session, final call: the final tree (main after merging issue-11-prefill6 and issue-10-decode6) on a GPU:
# every GPU test binary (NVRTC tests included), the sanitizers on every small grid, the Python suite from the abi3
# wheel with the CLI, and the Lean table (ferrattn bench, standard suite, SDPA in the same run).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v12h
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
for t in gpu_lean gpu_turboquant gpu_device_api gpu_turbo; do
  echo "== $t" >> $T; timeout 200 ./$t --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
done
for pair in "gpu_lean gpu_sanitizer_small_grid" "gpu_lean lean_device::gpu_device_sanitizer_small" "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
grep -E "==|result|rc=|FAILED|panicked" $T
rm -rf /tmp/site-v12h; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v12h wheels/*.whl > /dev/null 2>&1
R=$(cd "$B/.." && pwd); (cd /tmp && FERRATTN_CLI=$B/ferrattn PYTHONPATH=/tmp/site-v12h timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $T)
tail -3 $OUT/pytest.log
timeout 200 ./ferrattn bench --suite standard --algo lean --backend cuda --out $OUT/bl > $OUT/bench-lean.md 2> $OUT/bench-lean.log; echo "bench rc=$?"
cp $OUT/bl/bench.json $OUT/bench-lean.json 2>/dev/null; rm -rf $OUT/bl
grep -E '^\|' $OUT/bench-lean.md | head -20
tail -3 $T
