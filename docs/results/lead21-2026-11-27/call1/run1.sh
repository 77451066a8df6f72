#!/bin/bash
# Lead, twenty-first session, call 1: the merged tree (main e13f40a: TurboQuant compression under PDL 1019fd5 + the
# decode's late P·V b7fa659) on the GPU for the first time: gpu_turboquant and gpu_device_api in full, memcheck and
# racecheck on both TurboQuant sanitizer grids, and the TurboQuant decode / compression benches against main a602be2's
# binaries (/work/base-bins20) alternated, PyTorch SDPA for the decode shapes in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b1.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l21
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
timeout 150 ./gpu_turboquant --include-ignored --test-threads=1 > $W/t_tq.txt 2>&1; echo "$(ts) gpu_turboquant rc=$?: $(grep 'test result' $W/t_tq.txt | tail -1)" >> $I
timeout 200 ./gpu_device_api --include-ignored --test-threads=1 > $W/t_dev.txt 2>&1; echo "$(ts) gpu_device_api rc=$?: $(grep 'test result' $W/t_dev.txt | tail -1)" >> $I
for t in gpu_turboquant_sanitizer_small gpu_turboquant_fast_sanitizer_small; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turboquant $t --exact --include-ignored --test-threads=1 > $W/san_${tool}_$t.txt 2>&1; rc=$?
  echo "$(ts) $tool $t rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_${tool}_$t.txt) $(grep -m1 'test result' $W/san_${tool}_$t.txt)" >> $I; done; done
C=k2-v2,k3-v2,k3q-v2,k4q-v3
for rep in 1 2; do
  if [ $rep = 2 ]; then order="tq_new tq_base"; else order="tq_base tq_new"; fi
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    for b in $order; do echo "-- $b$rep $s" >> $W/tq.txt; timeout 60 ./$b $s --config $C 2>&1 | grep -E "turboquant|copy|error|panick" >> $W/tq.txt; done; done
  echo "$(ts) tq decode round $rep" >> $I
  [ $rep = 1 ] && { timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $W/sdpa_tq.json > $W/sdpa_tq.txt 2>&1; echo "$(ts) sdpa tq rc=$?" >> $I; }
done
for ob in "tqc_base 1" "tqc_new 1" "tqc_new 2" "tqc_base 2"; do set -- $ob; timeout 60 ./$1 --only fast,split > $W/compress_$1_$2.txt 2>&1; echo "$(ts) $1 $2 rc=$?" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/l21c1.tgz *; cat $I
grep -E "^--|16 x 16384|32 x 32768|1 x 32768" $W/tq.txt | head -40
grep -v Warning $W/sdpa_tq.txt | tail -6
for f in $W/compress_*; do echo "$(basename $f)"; grep -E '16 x 4096' $f | cut -d'|' -f2-8; done; ts done
