#!/bin/bash
# issue-10-compress19 call 2: turboquant_compress --only fast,split of main (/work/base-bins19, 3a6d195 = kernels of
# 64851b6) and new (variant 2 of the ring: a chunk heads first, one bulk copy per token of 8 heads) interleaved 3 times (base, new, ...); gpu_turboquant
# --include-ignored of new; memcheck + racecheck of the two small grids; ncu of base and new fast values d128
# (16 x 4k: the first 16 x 4k launch, -s 21 -c 1) and new MSE keys d128, values d64.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; R=$O/r; mkdir -p $R/ncu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $R/device.txt; date -u >> $R/device.txt
cat $R/device.txt
for i in 1 2 3; do for v in base new; do
  echo "== $v $i" >> $R/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $R/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|\| (fast|split) ' $R/bench.txt | grep -E '^==|ceiling|128 \| 16 x 4096 \| (values|keys k4 )' | cut -c1-90
timeout 100 ./bin/gtq_new --include-ignored --test-threads=1 --nocapture > $R/tests.txt 2>&1; echo "tests rc=$? t=$SECONDS"
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  echo "== $t $k"; timeout 60 $S --tool $t ./bin/gtq_new --include-ignored --exact $k 2>&1; echo "rc=$?"
done; done > $R/sanitizer.txt; echo "sanitizer t=$SECONDS"
echo "== tests"; grep -E 'test result|FAILED|panicked' $R/tests.txt | head -8
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' $R/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
M=smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active
for vk in base:values_d128 new:values_d128 base:values_d64 new:values_d64; do v=${vk%%:*}; k=${vk##*:}
  [ $SECONDS -gt ${LIMIT:-200} ] && { echo "skip ncu $v $k"; continue; }
  timeout 40 $N --clock-control none -k turboquant_fast_$k -s 21 -c 1 --import-source no \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --section MemoryWorkloadAnalysis --metrics $M \
    -o $R/ncu/${v}_$k ./bin/tqc_$v --only fast --iters 2 > $R/ncu/${v}_${k}.log 2>&1
  echo "ncu $v $k rc=$? t=$SECONDS"
  $N -i $R/ncu/${v}_$k.ncu-rep --page details --print-details all > $R/ncu/${v}_${k}_details.txt 2>&1
  $N -i $R/ncu/${v}_$k.ncu-rep --page source --csv --print-source sass > $R/ncu/${v}_${k}_sass.csv 2>&1
  $N -i $R/ncu/${v}_$k.ncu-rep --page raw --csv > $R/ncu/${v}_${k}_raw.csv 2>&1
  rm -f $R/ncu/${v}_$k.ncu-rep
  grep -E 'Duration|DRAM Throughput|Issue Slots Busy|Warp Cycles Per Issued|Eligible Warps|Active Warps Per' $R/ncu/${v}_${k}_details.txt | head -8
done
(cd $O && tar czf res.tgz r && rm -rf r)
ls -la $O
