#!/bin/bash
# issue-10-compress3 device call 2: tests (tip and the lookup-only fallback), sanitizers,
# bench of main / wgmma only (call 1) / + byte lookup / tip interleaved twice, ncu of the tip
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $O/device.txt; date >> $O/device.txt
cat $O/device.txt
for v in new lut; do
  echo "== tests $v" >> $O/tests.txt
  ./bin/gtq_$v --include-ignored --test-threads=1 --nocapture >> $O/tests.txt 2>&1; echo "tests $v rc=$?"
done
grep -E '^== tests|test result|FAILED|panicked' $O/tests.txt
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for v in new lut; do for t in memcheck racecheck; do
  echo "== $v $t" >> $O/sanitizer.txt
  $S --tool $t ./bin/gtq_$v --include-ignored --exact gpu_turboquant_fast_sanitizer_small >> $O/sanitizer.txt 2>&1
  echo "sanitizer $v $t rc=$?"; done; done
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
for i in 1 2; do for v in main w lut new; do
  echo "== $v $i" >> $O/bench.txt
  ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1
done; done
grep -E '^==|ceiling| fast ' $O/bench.txt | grep -v '^| 64 | 1 x' | cut -c1-70
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
for k in values keys_qjl keys_mse; do
  timeout 40 $N --clock-control none -k turboquant_fast_${k}_d128 -c 1 --section SpeedOfLight --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section InstructionStats --print-details all ./bin/tqc_new --only fast --iters 2 > $O/ncu_new_$k.txt 2>&1
  echo "ncu new $k"; grep -E 'L1/TEX Cache Throughput|Executed Instructions  |Warp Cycles Per Issued|Duration|bank conflict' $O/ncu_new_$k.txt | head -8
done
