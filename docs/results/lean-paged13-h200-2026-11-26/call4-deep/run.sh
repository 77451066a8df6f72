#!/bin/bash
# Thirteenth session, lead's second call: branch issue-9-paged-deep (deep paged instances: a four-stage ring where the
# grid has at most one CTA per SM; plan_paged = plan). gpu_lean (NVRTC included) and gpu_device_api, memcheck and
# racecheck on both small Lean grids, then lean_paged of main (4903ce5 kernels) and of the branch interleaved twice
# over the full list, the branch with --deep never (its three-stage ahead instances) and --same-plan rows.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-deep
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in main new main new; do ts "$v full list" >> $P; timeout 25 ./lean_paged_$v --out /tmp/$v.json >> $P 2>&1; echo "rc=$?" >> $P; cp /tmp/$v.json $OUT/$v.json 2>/dev/null; done
ts "new --deep never" >> $P; timeout 25 ./lean_paged_new --deep never >> $P 2>&1
for v in main new; do for o in lean:1:65536 lean:4:16384 llama:8:8192; do ts "$v --same-plan $o" >> $P; timeout 15 ./lean_paged_$v --same-plan --only $o >> $P 2>&1; done; done
cat $P | grep -v '^$'
T=$OUT/tests.txt
ts "gpu_lean" >> $T; timeout 170 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
ts "gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in lean_device::gpu_device_sanitizer_small gpu_sanitizer_small_grid; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done; done
cat $T; ts done
