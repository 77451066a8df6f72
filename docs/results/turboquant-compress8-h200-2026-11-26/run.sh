#!/bin/bash
# issue-10-compress8, device call: turboquant_compress --only fast,split of main (bef35d4's kernels,
# built in this branch's worktree before any change) and the branch variants interleaved twice,
# each run with its own copy ceiling; gpu_turboquant --include-ignored of each variant; memcheck +
# racecheck of the two small grids; ncu (warp states, scheduler) of main's and the variants' d 128
# fast values kernel at 1 x 32k.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O
LIMIT=${LIMIT:-110}
V=${VARIANTS:-new}
TV=${TESTS:-$V}  # variants whose gpu_turboquant runs
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
for i in 1 2; do for v in main $V; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|\| (fast|split) ' $O/bench.txt | grep -E '^==|ceiling|128 \| 16 x 4096|128 \| 1 x 32768' | cut -c1-100
for v in $TV; do
  (timeout 60 ./bin/gtq_$v --include-ignored --test-threads=1 --nocapture > $O/tests_$v.txt 2>&1; echo "tests $v rc=$? t=$SECONDS") &
done
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for v in $TV; do (
  for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
    echo "== $v $t $k"; timeout 40 $S --tool $t ./bin/gtq_$v --include-ignored --exact $k 2>&1
  done; done > $O/san_$v.txt; echo "sanitizer $v t=$SECONDS" ) &
done; wait
for v in $TV; do echo "== tests $v"; grep -E 'test result|FAILED|panicked' $O/tests_$v.txt | head -5; done
(cd $O && for v in $TV; do echo "== tests $v"; cat tests_$v.txt; done > tests.txt && rm tests_*.txt)
(cd $O && cat san_*.txt > sanitizer.txt && rm san_*.txt)
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
mkdir -p $O/ncu
NCUL=${NCU:-"main:values new:values"}
for vk in $NCUL; do v=${vk%%:*}; k=${vk##*:}
  R=$((LIMIT - SECONDS)); [ $R -lt 12 ] && { echo "skip ncu $v $k (time)"; continue; }
  timeout $R $N --clock-control none -k turboquant_fast_${k}_d128 -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats --metrics smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active ./bin/tqc_$v --only fast --iters 2 > $O/ncu/${v}_$k.txt 2>&1
  echo "ncu $v $k t=$SECONDS"; grep -E 'Duration|Achieved Occupancy|Issued Warp|Warp Cycles Per Issued|Stall|smsp__inst_executed.sum |gmma' $O/ncu/${v}_$k.txt | head -12
done
(cd $O && tar cJf ncu.tar.xz ncu && rm -rf ncu)
ls -la $O
