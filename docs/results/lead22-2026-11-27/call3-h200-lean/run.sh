#!/bin/bash
# Lead, twenty-second session, call 3 (H200): main 5b5cadd's Lean: gpu_lean (without its NVRTC test), memcheck + racecheck on
# the Lean small grids, the Lean table (ferrattn bench, standard suite, SDPA in the same run), lean_paged full list twice.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l22c
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o22c; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
(cd $R && timeout 240 $B/ferrattn bench --suite standard --algo lean --backend cuda --out $W/bl > $W/bench-lean.md 2> $W/bench-lean.log); rc=$?; echo "$(ts) bench rc=$rc" >> $I
cp $W/bl/bench.json $W/bench-lean.json 2>/dev/null; rm -rf $W/bl
for r in 1 2; do timeout 60 ./lean_paged > $W/paged_$r.txt 2>&1; rc=$?; echo "$(ts) lean_paged $r rc=$rc" >> $I; done
timeout 120 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc > $W/t_gpu_lean.txt 2>&1; rc=$?; echo "$(ts) gpu_lean rc=$rc: $(grep 'test result' $W/t_gpu_lean.txt | tail -1)" >> $I
for x in "memcheck gpu_sanitizer_small_grid" "racecheck gpu_sanitizer_small_grid" "memcheck lean_device::gpu_device_sanitizer_small" "racecheck lean_device::gpu_device_sanitizer_small"; do set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $1 --error-exitcode 9 ./gpu_lean $2 --exact --include-ignored --test-threads=1 > $W/san_$1_${2//:/_}.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$1_${2//:/_}.txt) $(grep -m1 'test result' $W/san_$1_${2//:/_}.txt)" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/l22c.tgz *; cat $I
grep -E '^\|' $W/bench-lean.md | head -60
for r in 1 2; do echo "== paged $r"; grep -E "ratio|paged|contig" $W/paged_$r.txt | tail -45; done
