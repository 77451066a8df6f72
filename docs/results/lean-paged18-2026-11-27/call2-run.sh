#!/bin/bash
# issue-9-paged18 call 2: f10c011 (REGS prologue: the first stages' page words in registers, no barrier before the first
# copy) against main 1a4e7dc. Tests (gpu_lean without NVRTC, gpu_device_api), memcheck + racecheck on the Lean small grids,
# lean_paged full list interleaved (base, new, base, new), new --contig-on-pool, REGS forced at Llama B=1 ctx 1k (both),
# one ncu of the new paged launch (Llama B=1 ctx 8k, pages of 16 in order), PyTorch SDPA on the list's shapes.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p18
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new
run ./lp_new --contig-on-pool
run ./lp_base --paged regs --only llama:1:1024; run ./lp_new --paged regs --only llama:1:1024
run ./lp_base --paged regs --only llama:1:1024; run ./lp_new --paged regs --only llama:1:1024
T=$OUT/tests.txt
for t in gpu_sanitizer_small_grid lean_device::gpu_device_sanitizer_small; do
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $tool $t rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done; done
ts "== gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "== gpu_lean" >> $T; timeout 90 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right" >> $T
timeout 40 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters -k "regex:^lean_decode_paged_regs_f16_d128_r4\$" --launch-skip 60 --launch-count 1 -o /tmp/new_p16o -f ./lp_new --only llama:1:8192 --contig-on-pool > /tmp/ncu.log 2>&1
ncu --import /tmp/new_p16o.ncu-rep --page details > $OUT/ncu-new.txt 2>&1
ncu --import /tmp/new_p16o.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz > $OUT/ncu-new-sass.csv.xz
run ./lp_base; run ./lp_new
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-lean.json $OUT/sdpa.json > $OUT/sdpa.txt 2>&1
date -u >> $OUT/env.txt; ts done >> $T
cat $T; grep -E "^\[|rc=|llama|lean " $P | grep -v "^rc=0" ; grep -E "sdpa|copy" $OUT/sdpa.txt | head -12; grep -E "Duration|Elapsed Cyc|SM Active" $OUT/ncu-new.txt
