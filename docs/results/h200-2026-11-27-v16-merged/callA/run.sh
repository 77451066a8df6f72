#!/bin/bash
# Lead, sixteenth session, call A: the merged tree (issue-10-b1, issue-9-paged16, issue-11-decode13 merged) on one GPU.
# gpu_device_api (Lean paged with the deep ring, the TurboQuant cache, TurboAttention decode with the PDL policy),
# gpu_turboquant (every test; the one-CTA-per-SM padding), memcheck/racecheck on both TurboQuant small grids,
# the Python suite from the abi3 wheel.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v16
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
ts "== gpu_device_api" >> $T; timeout 120 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
for t in gpu_turboquant_sanitizer_small gpu_turboquant_fast_sanitizer_small; do
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $t rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_turboquant" >> $T; timeout 200 ./gpu_turboquant --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
rm -rf /tmp/site-v16; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v16 $B/wheels/*.whl > /dev/null 2>&1
(cd /tmp && PYTHONPATH=/tmp/site-v16 timeout 150 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "$(ts) pytest rc=$?" >> $T)
grep -E "==|result|rc=|FAILED|panicked|SKIPPED" $T; tail -3 $OUT/pytest.log; ts done
