#!/bin/bash
# issue-10-compress11 call 2: turboquant_compress --only fast,split of main (1a4e7dc, /work/base-bins18),
# A (d10b9e0: prologue loads first + f64 norm window 2^-20) and B (main + the f64 window only, fatbin swap)
# interleaved twice; gpu_turboquant --include-ignored of A; memcheck + racecheck of the two small grids
# for A; ncu of A (and B values) at 16 x 4k as in call 1.
cd "$(dirname "$0")"
tar xJf bins2.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O/ncu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
for i in 1 2; do for v in main A B; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|\| (fast|split) ' $O/bench.txt | grep -E '^==|ceiling|128 \| 16 x 4096 \| (values|keys k4 )' | cut -c1-90
(timeout 90 ./bin/gtq_A --include-ignored --test-threads=1 --nocapture > $O/tests.txt 2>&1; echo "tests A rc=$? t=$SECONDS") &
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
( for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
    echo "== A $t $k"; timeout 60 $S --tool $t ./bin/gtq_A --include-ignored --exact $k 2>&1; echo "rc=$?"
  done; done > $O/sanitizer.txt; echo "sanitizer t=$SECONDS" ) &
wait
echo "== tests A"; grep -E 'test result|FAILED|panicked' $O/tests.txt | head -8
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' $O/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
M=smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
for vk in A:values_d128 A:keys_mse_d128 B:values_d128 A:values_d64; do v=${vk%%:*}; k=${vk##*:}
  [ $SECONDS -gt ${LIMIT:-150} ] && { echo "skip ncu $v $k"; continue; }
  timeout 40 $N --clock-control none -k turboquant_fast_$k -s 21 -c 1 --import-source no \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --metrics $M \
    -o $O/ncu/${v}_$k ./bin/tqc_$v --only fast --iters 2 > $O/ncu/${v}_${k}.log 2>&1
  echo "ncu $v $k rc=$? t=$SECONDS"
  $N -i $O/ncu/${v}_$k.ncu-rep --page source --csv --print-source sass > $O/ncu/${v}_${k}_sass.csv 2>&1
  $N -i $O/ncu/${v}_$k.ncu-rep --page raw --csv > $O/ncu/${v}_${k}_raw.csv 2>&1
  rm -f $O/ncu/${v}_$k.ncu-rep
done
(cd $O && tar cJf ncu.tar.xz ncu && rm -rf ncu)
ls -la $O
