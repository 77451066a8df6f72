#!/bin/bash
# Sixteenth session (issue 9, Lean paged), one call: branch issue-9-paged16 (deep REGS instances: a four-stage
# ring for paged grids of one CTA per SM) against main 1eb66ef's lean_paged (/work/base-bins), interleaved
# base, new, base, new at the planners' grids (timings alone on the GPU); new with REGS forced (the three-stage
# ring, same binary); Lean-paper B=4 ctx 16k with the paged storages on contiguous's 112-CTA grid (--same-plan:
# REGS on main, deep on the branch) and on 132 CTAs; then the tests in two lanes: racecheck of
# lean_device::gpu_device_sanitizer_small beside gpu_device_api, memcheck/racecheck of the small Lean grids and
# gpu_lean without its NVRTC test (210 Lean kernels to JIT: past the 60 s the brief allows it).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
LIMIT=${LIMIT:-95}
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
mkdir -p /tmp/b; xz -dc -T4 bins.tar.xz | tar xf - -C /tmp/b; chmod +x /tmp/b/*; ts unpacked
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
run() { ts "$*" >> $P; timeout 30 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for v in base new base new; do run /tmp/b/lean_paged_$v --out /tmp/$v-full-$(date +%s%N).json; done
run /tmp/b/lean_paged_new --paged regs --out /tmp/new-regs-$(date +%s%N).json
for v in base new base new; do run /tmp/b/lean_paged_$v --same-plan --only lean:4:16384 --out /tmp/$v-same-$(date +%s%N).json; done
run /tmp/b/lean_paged_new --paged-ctas 132 --only lean:4:16384 --out /tmp/new-p132-$(date +%s%N).json
run /tmp/b/lean_paged_new --ctas 132 --only lean:4:16384 --out /tmp/new-c132-$(date +%s%N).json
(cd /tmp && tar czf $OUT/json.tgz *.json)
grep -v '^$' $P
R=$OUT/racecheck.txt
( t=lean_device::gpu_device_sanitizer_small
  FERRATTN_GPU_TEST_SCALE=small timeout $(( LIMIT - ($(date +%s) - S) )) compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/b/gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/race.txt 2>&1; rc=$?
  echo "$(ts) racecheck $t rc=$rc: $(grep -m1 -E 'RACECHECK SUMMARY' /tmp/race.txt)" >> $R; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/race.txt >> $R; tail -3 /tmp/race.txt >> $R ) &
T=$OUT/tests.txt
ts "gpu_device_api" >> $T; timeout 40 /tmp/b/gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" >> $T; echo "rc=${PIPESTATUS[0]}" >> $T
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do for tool in memcheck racecheck; do
  [ $t$tool = lean_device::gpu_device_sanitizer_smallracecheck ] && continue
  FERRATTN_GPU_TEST_SCALE=small timeout 40 compute-sanitizer --tool $tool --error-exitcode 9 /tmp/b/gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $t rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done; done
ts "gpu_lean (all but NVRTC)" >> $T; timeout $(( LIMIT - ($(date +%s) - S) )) /tmp/b/gpu_lean --include-ignored --test-threads=1 --skip gpu_nvrtc_path_matches_golden 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T; echo "rc=${PIPESTATUS[0]}" >> $T
wait; cat $T $R; ts done
