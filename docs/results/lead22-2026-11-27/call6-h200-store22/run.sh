#!/bin/bash
# Lead, twenty-second session, call 6: issue-9-store22 (the output and partial stores by 16-byte vectors) against issue-9-merge22 (main cf764b0's Lean kernels)
# gpu_lean (no NVRTC test), gpu_device_api, memcheck + racecheck on the Lean small grids (new); lean_paged base/new x2; the Lean
# table (ferrattn bench standard lean) new with SDPA, then base/new alternated twice without torch.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l22e
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o22e; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
timeout 120 ./new/gpu_lean --include-ignored --test-threads=1 --skip nvrtc > $W/t_gpu_lean.txt 2>&1; rc=$?; echo "$(ts) gpu_lean rc=$rc: $(grep 'test result' $W/t_gpu_lean.txt | tail -1)" >> $I
timeout 60 ./new/gpu_device_api --include-ignored --test-threads=1 > $W/t_gpu_device_api.txt 2>&1; rc=$?; echo "$(ts) gpu_device_api rc=$rc: $(grep 'test result' $W/t_gpu_device_api.txt | tail -1)" >> $I
for x in "memcheck gpu_sanitizer_small_grid" "racecheck gpu_sanitizer_small_grid" "memcheck lean_device::gpu_device_sanitizer_small" "racecheck lean_device::gpu_device_sanitizer_small"; do set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $1 --error-exitcode 9 ./new/gpu_lean $2 --exact --include-ignored --test-threads=1 > $W/san_$1_${2//:/_}.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$1_${2//:/_}.txt) $(grep -m1 'test result' $W/san_$1_${2//:/_}.txt)" >> $I; done
for r in 1 2; do for v in base new; do timeout 60 ./$v/lean_paged > $W/paged_${v}_$r.txt 2>&1; rc=$?; echo "$(ts) lean_paged $v $r rc=$rc" >> $I; done; done
(cd $R && timeout 200 $B/new/ferrattn bench --suite standard --algo lean --backend cuda --out $W/bl > $W/bench-new-torch.md 2> $W/bench-new-torch.log); rc=$?; echo "$(ts) bench new torch rc=$rc" >> $I
cp $W/bl/bench.json $W/bench-new-torch.json 2>/dev/null; rm -rf $W/bl
for r in 1 2; do for v in base new; do
  (cd $R && timeout 120 $B/$v/ferrattn bench --suite standard --algo lean --backend cuda --no-torch --out $W/bl > $W/bench-$v-$r.md 2> $W/bench-$v-$r.log); rc=$?; echo "$(ts) bench $v $r rc=$rc" >> $I
  cp $W/bl/bench.json $W/bench-$v-$r.json 2>/dev/null; rm -rf $W/bl; done; done
date -u >> $I; cd $W && tar czf $OUT/l22e.tgz *; cat $I
for f in $W/paged_*; do echo "== $f"; tail -9 $f; done
