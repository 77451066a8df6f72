#!/bin/bash
# issue-10-compress6 device call 1: turboquant_compress --only fast,split of main (dcc6bd1),
# r1 (the raw-row ring by cp.async) and r2 (the ring by 1-D bulk copies) interleaved twice, each
# run with its own copy ceiling; gpu_turboquant --include-ignored of r1 and r2; memcheck +
# racecheck of the two small sanitizer grids for each; ncu source counters of the d 128 values.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O $O/ncu
LIMIT=${LIMIT:-165}
V=${VARIANTS:-"r1 r2"}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
for i in 1 2; do for v in main $V; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling| fast ' $O/bench.txt | grep -E '^==|\| 128 \| 16 x 4096' | cut -c1-72
for v in $V; do
  (timeout 70 ./bin/gtq_$v --include-ignored --test-threads=1 --nocapture > $O/tests_$v.txt 2>&1; echo "tests $v rc=$? t=$SECONDS") &
done; wait
for v in $V; do echo "== tests $v"; grep -E 'test result|FAILED|panicked' $O/tests_$v.txt | head -5; done
(cd $O && for v in $V; do echo "== tests $v"; cat tests_$v.txt; done > tests.txt && rm tests_*.txt)
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for v in $V; do (
  for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
    echo "== $v $t $k"; timeout 40 $S --tool $t ./bin/gtq_$v --include-ignored --exact $k 2>&1
  done; done > $O/san_$v.txt; echo "sanitizer $v t=$SECONDS" ) &
done; wait
(cd $O && cat san_*.txt > sanitizer.txt && rm san_*.txt)
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
for vk in ${NCU:-"r2:values r1:values"}; do v=${vk%%:*}; k=${vk##*:}
  R=$((LIMIT - SECONDS)); [ $R -lt 12 ] && { echo "skip ncu $v $k (time)"; continue; }
  timeout $R $N --clock-control none -k turboquant_fast_${k}_d128 -c 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis -o $O/ncu/${v}_$k ./bin/tqc_$v --only fast --iters 2 > $O/ncu/${v}_$k.log 2>&1
  $N -i $O/ncu/${v}_$k.ncu-rep --page source --csv --print-source sass > $O/ncu/${v}_${k}_sass.csv 2>&1
  $N -i $O/ncu/${v}_$k.ncu-rep --page details --print-details all > $O/ncu/${v}_${k}_details.txt 2>&1
  rm -f $O/ncu/${v}_$k.ncu-rep
  echo "ncu $v $k t=$SECONDS"; grep -E 'Executed Instructions  |Warp Cycles Per Issued|Duration|Lsu Wavefronts|Issue Active' $O/ncu/${v}_${k}_details.txt | head -7
done
(cd $O && tar cJf ncu.tar.xz ncu && rm -rf ncu)
ls -la $O
