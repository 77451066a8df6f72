#!/bin/bash
# Twelfth session, call 1: main 0ca50bd (plan_paged returns plan's grids) on a GPU: gpu_lean, gpu_device_api,
# sanitizers on the Lean small grids, the Python paged/lean tests from the abi3 wheel; lean_paged of the
# new tree against the previous main (slot-filling paged grids), full list, twice; the window probe.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v12a
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
echo "== gpu_lean" >> $T; timeout 200 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
echo "== gpu_device_api" >> $T; timeout 90 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
grep -E "==|result|rc=|FAILED|panicked" $T
rm -rf /tmp/site-v12a; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v12a wheels/*.whl > /dev/null 2>&1
R=$(cd "$B/.." && pwd); (cd /tmp && PYTHONPATH=/tmp/site-v12a timeout 150 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $T)
tail -3 $OUT/pytest.log
P=$OUT/paged.txt
for v in prev new prev new; do echo "== $v full list (rotated)" >> $P; timeout 60 ./lean_paged_$v >> $P 2>&1; done
echo "== new --window-bytes 2097152" >> $P; timeout 60 ./lean_paged_new --window-bytes 2097152 >> $P 2>&1
echo "== new --window-bytes 262144" >> $P; timeout 60 ./lean_paged_new --window-bytes 262144 >> $P 2>&1
cat $P
N=$OUT/ncu.txt
for k in "regex:^lean_decode_f16" "regex:lean_decode_paged_ahead"; do
  echo "== ncu $k llama:64:1024 (first paged = pages of 16 shuffled)" >> $N
  timeout 90 ncu -k "$k" --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --metrics smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct ./lean_paged_new --only llama:64:1024 --sets 1 >> $N 2>&1
done
grep -E "==|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|inst_executed|dram__bytes|Stall|Grid Size|Registers" $N | head -60
