#!/bin/bash
# Lead, fourteenth session: the merged tree on one GPU. Lean paged with PagedRead::Auto (main f7a8ee5's lean_paged)
# against main dcc6bd1's lean_paged interleaved twice; gpu_lean (NVRTC test with its PTX from the disk cache, compiled
# off the GPU by the same libnvrtc 13.0), gpu_device_api, memcheck/racecheck on the small Lean grids (test binaries of
X=$(cd "$(dirname "$0")" && pwd); B=$X/../.gpu-bundle-v14; R=$(cd "$X/.." && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v14
mkdir -p $FERRATTN_CACHE_DIR; cp $X/ptxcache/*.ptx $FERRATTN_CACHE_DIR/
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat $B/COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in main new main new; do ts "$v full list" >> $P; timeout 40 $X/lean_paged_$v --out /tmp/$v.json >> $P 2>&1; echo "rc=$?" >> $P; done
cp /tmp/main.json $OUT/paged-main.json; cp /tmp/new.json $OUT/paged-new.json
T=$OUT/tests.txt; cd $B
ts "gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for pair in "gpu_lean lean_device::gpu_device_sanitizer_small" "gpu_lean gpu_sanitizer_small_grid"; do set -- $pair
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./$1 $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $2 rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "gpu_lean" >> $T; timeout 120 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
rm -rf /tmp/site-v14; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v14 $B/wheels/*.whl > /dev/null 2>&1
(cd /tmp && PYTHONPATH=/tmp/site-v14 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "$(ts) pytest rc=$?" >> $T)
grep -E "==|result|rc=|FAILED|panicked|gpu_" $T | grep -v '^test .* ok$'; tail -3 $OUT/pytest.log
grep -E 'ratio|paged|contig' $P | head -5; ts done
