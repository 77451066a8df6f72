#!/bin/bash
# Fifteenth session (issue 9, Lean paged), call 2: branch issue-9-paged15 (REGS prologue: the first stages' page words
# copied at CTA start) against main bef35d4's lean_paged interleaved twice at the planners' grids (timings alone on the
# GPU); then Lean-paper B=4 ctx 16k with the paged storages on 224 CTAs (one tile each; contiguous at its 112) twice and
# with contiguous on the paged grid (264); then the tests, two lanes at once: the NVRTC test (PTX from the disk cache,
# JIT on the CPU) beside gpu_device_api, memcheck/racecheck on both small Lean grids and the rest of gpu_lean.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p15; mkdir -p $FERRATTN_CACHE_DIR; cp ptxcache/*.ptx $FERRATTN_CACHE_DIR/
LIMIT=${LIMIT:-130}
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in main new main new; do ts "$v full list" >> $P; timeout 30 ./lean_paged_$v --out /tmp/$v.json >> $P 2>&1; echo "rc=$?" >> $P; cp /tmp/$v.json /tmp/$v-$(date +%s%N).json; done
for a in "--paged-ctas 224" "--paged-plan" "--ctas 224" "--paged-ctas 224"; do ts "new --only lean:4:16384 $a" >> $P; timeout 20 ./lean_paged_new --only lean:4:16384 $a --out /tmp/new-b4-${a// /}-$(date +%s%N).json >> $P 2>&1; echo "rc=$?" >> $P; done
(cd /tmp && tar czf $OUT/json.tgz *.json)
grep -v '^$' $P
N=$OUT/nvrtc.txt
( ts "gpu_lean NVRTC test, PTX from the disk cache" >> $N
  timeout $(( LIMIT - ($(date +%s) - S) )) ./gpu_lean --include-ignored --test-threads=1 gpu_nvrtc_path_matches_golden --exact 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|NVRTC" >> $N; echo "$(ts) rc=${PIPESTATUS[0]}" >> $N ) &
R=$OUT/racecheck.txt
( t=lean_device::gpu_device_sanitizer_small
  FERRATTN_GPU_TEST_SCALE=small timeout $(( LIMIT - ($(date +%s) - S) )) compute-sanitizer --tool racecheck --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/race.txt 2>&1; rc=$?
  echo "$(ts) racecheck $t rc=$rc: $(grep -m1 -E 'RACECHECK SUMMARY' /tmp/race.txt)" >> $R; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/race.txt >> $R; tail -3 /tmp/race.txt >> $R ) &
T=$OUT/tests.txt
ts "gpu_device_api" >> $T; timeout 40 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  [ $t$tool = lean_device::gpu_device_sanitizer_smallracecheck ] && continue
  FERRATTN_GPU_TEST_SCALE=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $t rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done; done
ts "gpu_lean (all but NVRTC)" >> $T; timeout 40 ./gpu_lean --include-ignored --test-threads=1 --skip gpu_nvrtc_path_matches_golden 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
wait; cat $T $R $N; ts done
