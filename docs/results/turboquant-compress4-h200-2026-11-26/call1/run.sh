#!/bin/bash
# issue-10-compress4 device call: bench of main's and this branch's turboquant_compress
# interleaved twice (each run with its own copy ceiling), gpu_turboquant --include-ignored,
# memcheck and racecheck of the two small sanitizer grids, then ncu of the d 128 fast kernels
# while time is left. Binaries in ./bin (tqc_main, tqc_new, gtq_new); results in $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O
LIMIT=${LIMIT:-165}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
for i in 1 2; do for v in main new; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling| fast ' $O/bench.txt | grep -v '| 64 | 1 x' | cut -c1-72
timeout 60 ./bin/gtq_new --include-ignored --test-threads=1 --nocapture > $O/tests.txt 2>&1; echo "tests rc=$? t=$SECONDS"
grep -E 'test result|FAILED|panicked' $O/tests.txt | head -20
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  R=$((LIMIT - SECONDS)); [ $R -lt 8 ] && { echo "skip $t $k (time)"; continue; }
  echo "== $t $k" >> $O/sanitizer.txt
  timeout $R $S --tool $t ./bin/gtq_new --include-ignored --exact $k >> $O/sanitizer.txt 2>&1; echo "sanitizer $t $k rc=$? t=$SECONDS"
done; done
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
for k in values keys_qjl; do
  R=$((LIMIT - SECONDS)); [ $R -lt 15 ] && { echo "skip ncu $k (time)"; continue; }
  timeout $R $N --clock-control none -k turboquant_fast_${k}_d128 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section InstructionStats --section LaunchStats --section Occupancy ./bin/tqc_new --only fast --iters 2 > $O/ncu_new_$k.txt 2>&1
  echo "ncu $k t=$SECONDS"; grep -E 'L1/TEX Cache Throughput|Executed Instructions  |Warp Cycles Per Issued|Duration|Registers Per|Achieved Occupancy' $O/ncu_new_$k.txt | head -8
done
