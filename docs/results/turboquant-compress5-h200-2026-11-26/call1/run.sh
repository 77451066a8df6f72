#!/bin/bash
# issue-10-compress5 device call 1: ncu source counters (stall reasons per SASS line) of main's
# d 128 fast values / QJL-keys kernels and of c1's (a884687: rows two chunks ahead prefetched into
# L2, next chunk's dst0/count loads before the wgmma wait); turboquant_compress --only fast,split
# of main and c1 interleaved twice (each run with its own copy ceiling); gpu_turboquant
# --include-ignored of c1; memcheck + racecheck of the two small sanitizer grids (c1).
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O $O/ncu
LIMIT=${LIMIT:-140}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
for i in 1 2; do for v in main c1; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling| fast ' $O/bench.txt | grep '| 128 | 16 x' | cut -c1-72
echo "== tests c1" >> $O/tests.txt
timeout 60 ./bin/gtq_c1 --include-ignored --test-threads=1 --nocapture >> $O/tests.txt 2>&1; echo "tests c1 rc=$? t=$SECONDS"
grep -E '^== tests|test result|FAILED|panicked' $O/tests.txt | head -20
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
for v in main c1; do for k in values keys_qjl; do
  R=$((LIMIT - 30 - SECONDS)); [ $R -lt 8 ] && { echo "skip ncu $v $k (time)"; continue; }
  timeout $R $N --clock-control none -k turboquant_fast_${k}_d128 -c 1 --section SpeedOfLight --section WarpStateStats --section SourceCounters --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis_Tables -o $O/ncu/${v}_$k ./bin/tqc_$v --only fast --iters 2 > $O/ncu/${v}_$k.log 2>&1
  $N -i $O/ncu/${v}_$k.ncu-rep --page source --csv --print-source sass > $O/ncu/${v}_${k}_sass.csv 2>&1
  $N -i $O/ncu/${v}_$k.ncu-rep --page details --print-details all > $O/ncu/${v}_${k}_details.txt 2>&1
  echo "ncu $v $k t=$SECONDS"; grep -E 'Executed Instructions  |Warp Cycles Per Issued|Duration|Stall (Long|Short|Wait|GMMA|LG)|Issued Ipc' $O/ncu/${v}_${k}_details.txt | head -10
done; done
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  R=$((LIMIT - SECONDS)); [ $R -lt 8 ] && { echo "skip $t $k (time)"; continue; }
  echo "== c1 $t $k" >> $O/sanitizer.txt
  timeout $R $S --tool $t ./bin/gtq_c1 --include-ignored --exact $k >> $O/sanitizer.txt 2>&1; echo "sanitizer $t $k rc=$? t=$SECONDS"
done; done
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
(cd $O && tar cJf ncu.tar.xz ncu && rm -rf ncu)
ls -la $O
