#!/bin/bash
# Fifteenth session (issue 9, Lean paged), call 1: branch issue-9-paged15 (REGS prologue: the first stages' page words
# copied at CTA start from the CTA's record / the page-table row) against main bef35d4's lean_paged (built 17:25 from
# the merged tree; its embedded lean_decode.cu equals main's) interleaved twice at the planners' grids, then twice
# with --same-plan (paged at lean::plan's grid: Lean-paper B=4 ctx 16k on 112 CTAs), then the branch with REGS forced;
# gpu_device_api, memcheck/racecheck on both small Lean grids, gpu_lean incl. its NVRTC test (PTX from the disk cache).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p15; mkdir -p $FERRATTN_CACHE_DIR; cp ptxcache/*.ptx $FERRATTN_CACHE_DIR/
LIMIT=${LIMIT:-165}
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in main new main new; do ts "$v full list" >> $P; timeout 30 ./lean_paged_$v --out /tmp/$v.json >> $P 2>&1; echo "rc=$?" >> $P; done
for v in main new main new; do ts "$v --same-plan full list" >> $P; timeout 30 ./lean_paged_$v --same-plan --out /tmp/$v-same.json >> $P 2>&1; echo "rc=$?" >> $P; done
ts "new --paged regs full list" >> $P; timeout 30 ./lean_paged_new --paged regs --out /tmp/new-regs.json >> $P 2>&1; echo "rc=$?" >> $P
ts "main --paged regs full list" >> $P; timeout 30 ./lean_paged_main --paged regs --out /tmp/main-regs.json >> $P 2>&1; echo "rc=$?" >> $P
(cd /tmp && tar czf $OUT/json.tgz *.json)
grep -v '^$' $P
T=$OUT/tests.txt
ts "gpu_device_api" >> $T; timeout 40 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in lean_device::gpu_device_sanitizer_small gpu_sanitizer_small_grid; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done; done
ts "gpu_lean (all but NVRTC)" >> $T; timeout 60 ./gpu_lean --include-ignored --test-threads=1 --skip gpu_nvrtc_path_matches_golden 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
LEFT=$(( LIMIT - ($(date +%s) - S) ))
ts "gpu_lean NVRTC test, PTX from the disk cache (timeout ${LEFT}s)" >> $T
timeout $LEFT ./gpu_lean --include-ignored --test-threads=1 gpu_nvrtc_path_matches_golden --exact --nocapture 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|NVRTC" >> $T; echo "rc=$?" >> $T
cat $T; ts done
