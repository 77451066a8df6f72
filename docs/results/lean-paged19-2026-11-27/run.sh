#!/bin/bash
# issue-9-paged19: 356974b (the stages of a segment as an inner loop with one exit: the stage's back-edge follows the stage)
# against main 1a4e7dc. lean_paged full list interleaved (base, new) x3, ncu of Llama B=1 ctx 8k (the 61st launch of the kernel,
# separate allocations: main's bench has no --contig-on-pool) paged and contiguous for both binaries, PyTorch SDPA, gpu_lean (no NVRTC), gpu_device_api, memcheck +
# racecheck on the Lean small grids (the long racecheck last).
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p19
mkdir -p $FERRATTN_CACHE_DIR
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new
run ./lp_new --contig-on-pool
N=$OUT/ncu.txt
for b in base new; do for k in lean_decode_paged_regs_f16_d128_r4 lean_decode_f16_d128_r4; do
  timeout 40 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters -k "regex:^$k\$" --launch-skip 60 --launch-count 1 -o /tmp/n_${b}_$k -f ./lp_$b --only llama:1:8192 > /tmp/ncu.log 2>&1
  echo "== $b $k" >> $N; ncu --import /tmp/n_${b}_$k.ncu-rep --page details 2>&1 | grep -E "Duration|Elapsed Cycles|SM Active|Executed Instructions  |No Instruction|Warp Cycles Per Issued" >> $N
  ncu --import /tmp/n_${b}_$k.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz > $OUT/ncu-$b-$k.csv.xz
done; done
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-lean.json $OUT/sdpa.json > $OUT/sdpa.txt 2>&1
run ./lp_base; run ./lp_new
T=$OUT/tests.txt
ts "== gpu_lean" >> $T; timeout 90 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right" >> $T
# gpu_device_api not carried (the bundle with it passed the carry limit)
for x in "memcheck gpu_sanitizer_small_grid" "racecheck gpu_sanitizer_small_grid" "memcheck lean_device::gpu_device_sanitizer_small" "racecheck lean_device::gpu_device_sanitizer_small"; do
  set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $1 --error-exitcode 9 ./gpu_lean $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T
done
date -u >> $OUT/env.txt; ts done >> $T
cat $T; grep -E "^\[|rc=[1-9]|llama|lean " $P; grep -E "sdpa|copy" $OUT/sdpa.txt | head -12; cat $N
