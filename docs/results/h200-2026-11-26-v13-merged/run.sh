#!/bin/bash
# Thirteenth session, the merged tree (issue-10-compress4, issue-11-prefill7, issue-10-decode7, issue-11-decode8 on
# main): every GPU test binary of the changed kernels (NVRTC tests included), the sanitizers on their small grids, and
# the Python suite from the abi3 wheel with the CLI. No timings (each branch timed its change against main in its own
# calls).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v13z
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
for t in gpu_turboquant gpu_device_api gpu_turbo; do
  echo "$(ts) == $t" >> $T; timeout 200 ./$t --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
done
for pair in "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small" "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
grep -E "==|result|rc=|FAILED|panicked" $T
rm -rf /tmp/site-v13z; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v13z wheels/*.whl > /dev/null 2>&1
R=$(cd "$B/.." && pwd); (cd /tmp && FERRATTN_CLI=$B/ferrattn PYTHONPATH=/tmp/site-v13z timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "$(ts) pytest rc=$?" >> $T)
tail -3 $OUT/pytest.log; tail -2 $T
