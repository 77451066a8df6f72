#!/bin/bash
# issue-10-compress4 device call 2 (the last): turboquant_compress of main (4903ce5), variant a
# (232e5c1: 4 CTAs per SM, 16-byte staging, 4-chain norm) and variant b (the tip: + the norm
# folded into the code lookup, d 64 at 5-6 CTAs per SM) interleaved twice (each run with its
# own copy ceiling), gpu_turboquant --include-ignored of b and a, memcheck and racecheck of the
# two small sanitizer grids (b, then a while time is left), ncu of b's d 128 fast kernels.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O
LIMIT=${LIMIT:-165}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
for i in 1 2; do for v in main a b; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling| fast ' $O/bench.txt | grep -v '| 64 | 1 x' | cut -c1-72
for v in b a; do
  echo "== tests $v" >> $O/tests.txt
  timeout 60 ./bin/gtq_$v --include-ignored --test-threads=1 --nocapture >> $O/tests.txt 2>&1; echo "tests $v rc=$? t=$SECONDS"
done
grep -E '^== tests|test result|FAILED|panicked' $O/tests.txt | head -20
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for v in b a; do for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  R=$((LIMIT - 25 - SECONDS)); [ $R -lt 8 ] && { echo "skip $v $t $k (time)"; continue; }
  echo "== $v $t $k" >> $O/sanitizer.txt
  timeout $R $S --tool $t ./bin/gtq_$v --include-ignored --exact $k >> $O/sanitizer.txt 2>&1; echo "sanitizer $v $t $k rc=$? t=$SECONDS"
done; done; done
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
for k in values keys_qjl keys_mse; do
  R=$((LIMIT - SECONDS)); [ $R -lt 8 ] && { echo "skip ncu $k (time)"; continue; }
  timeout $R $N --clock-control none -k turboquant_fast_${k}_d128 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy --print-details all ./bin/tqc_b --only fast --iters 2 > $O/ncu_b_$k.txt 2>&1
  echo "ncu $k t=$SECONDS"; grep -E 'L1/TEX Cache Throughput|Executed Instructions  |Warp Cycles Per Issued|Duration|Achieved Occupancy|Stall (Short|Long|Wait|Not Sel|MIO|GMMA|LG|Math|Barrier|Branch)' $O/ncu_b_$k.txt | head -16
done
