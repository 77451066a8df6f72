#!/bin/bash
# Lead, fifteenth session: the merged tree (prefill11, decode11, paged15, pack2) on one GPU. Tests only, no timings:
# gpu_device_api (the Lean paged workspace of paged15 and the TurboQuant byte accounting of pack2 meet there),
# gpu_turbo (NVRTC tests included: prefill11's changed source had not run NVRTC on a GPU), memcheck/racecheck on the
# small TurboAttention grid, the Python suite from the wheel. gpu_turboquant and gpu_lean ran on their branches, whose
# kernel and backend sources equal the merged tree's; left out for the carry limit.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"
[ -f bins.tar.xz ] && tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v15
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
for t in gpu_device_api; do ts "== $t" >> $T; timeout 90 ./$t --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T; done
for pair in "gpu_turbo gpu_turbo_sanitizer_small"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_turbo" >> $T; timeout 150 ./gpu_turbo --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
rm -rf /tmp/site-v15; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v15 $B/wheels/*.whl > /dev/null 2>&1
(cd /tmp && PYTHONPATH=/tmp/site-v15 timeout 120 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "$(ts) pytest rc=$?" >> $T)
grep -E "==|result|rc=|FAILED|panicked" $T; tail -3 $OUT/pytest.log; ts done
