#!/bin/bash
# Thirteenth session, call 1 (issue-9-paged-bulk): Lean bulk copies. The device-path test (both copy paths against
# each other and the golden), lean_paged of main (4903ce5) and of the branch (--copy both: cp.async and bulk variants
# interleaved in the same batches), interleaved twice, memcheck/racecheck of the small device cases (bulk included),
# the NVRTC test with bulk copies by default.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p13
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
ts "device path, both copy paths" >> $T
timeout 45 ./gpu_lean --include-ignored --test-threads=1 lean_device::gpu_device_path_and_paged_kv_match 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|bulk" >> $T
cat $T
P=$OUT/paged.txt
for v in main new main new; do
  a=""; [ $v = new ] && a="--copy both"
  ts "$v --quick $a" >> $P; timeout 20 ./lean_paged_$v --quick $a --out /tmp/$v.json >> $P 2>&1
done
cat $P; cp /tmp/new.json $OUT/new_quick.json; cp /tmp/main.json $OUT/main_quick.json
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 25 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean lean_device::gpu_device_sanitizer_small --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool lean_device::gpu_device_sanitizer_small rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done
ts "NVRTC, bulk by default" >> $T
FERRATTN_LEAN_COPY=bulk timeout 25 ./gpu_lean --include-ignored --test-threads=1 gpu_nvrtc_path_matches_golden 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
ts done >> $T; cat $T
