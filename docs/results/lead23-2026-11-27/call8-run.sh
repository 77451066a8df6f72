#!/bin/bash
# Lead, twenty-third session, call 8 (H200): review change to the warps' one-pass merge (threads < R leave each warp's
# scale in wml; the summing threads read it instead of recomputing max and exp2) against main 1addf2d's kernels (base):
# gpu_lean (without NVRTC), gpu_device_api, memcheck + racecheck on both Lean small grids, lean_paged base/new x3.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l23
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o23; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "new = main 1addf2d + the merge's scales from wml; base = main 1addf2d"; } > $I
timeout 120 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc > $W/t_gpu_lean.txt 2>&1; rc=$?; echo "$(ts) gpu_lean rc=$rc: $(grep 'test result' $W/t_gpu_lean.txt | tail -1)" >> $I
timeout 120 ./gpu_device_api --include-ignored --test-threads=1 > $W/t_gpu_device_api.txt 2>&1; rc=$?; echo "$(ts) gpu_device_api rc=$rc: $(grep 'test result' $W/t_gpu_device_api.txt | tail -1)" >> $I
for x in "memcheck gpu_sanitizer_small_grid" "racecheck gpu_sanitizer_small_grid" "memcheck lean_device::gpu_device_sanitizer_small" "racecheck lean_device::gpu_device_sanitizer_small"; do set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $1 --error-exitcode 9 ./gpu_lean $2 --exact --include-ignored --test-threads=1 > $W/san_$1_${2//:/_}.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$1_${2//:/_}.txt) $(grep -m1 'test result' $W/san_$1_${2//:/_}.txt)" >> $I; done
for r in 1 2 3; do for v in base new; do timeout 60 ./lean_paged_$v > $W/paged_${v}_$r.txt 2>&1; rc=$?; echo "$(ts) lean_paged $v $r rc=$rc" >> $I; done; done
date -u >> $I; cd $W && tar czf $OUT/l23.tgz *; cat $I
for v in base new; do for r in 1 2 3; do echo "== $v $r"; grep -E "^(llama|lean) " $W/paged_${v}_$r.txt; done; done
