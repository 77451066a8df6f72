#!/bin/bash
# issue-10-compress10, one device call: turboquant_compress --only fast,split of main (a005076,
# /work/base-bins17), new (the branch: 2- and 3-bit codes by comparisons in registers; QJL keys keep
# the table) and qjl (new + QJL keys' 3-bit MSE part by the integer compare code, measurement
# only) interleaved twice (main, new, qjl, main, new, qjl), each run with its own copy ceiling;
# gpu_turboquant --include-ignored of new; memcheck + racecheck of the two small grids for new.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
V=${V:-"new qjl"}; SAN=${SAN:-new}
for i in 1 2; do for v in main $V; do
  echo "== $v $i" >> $O/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|\| (fast|split) ' $O/bench.txt | grep -E '^==|ceiling|128 \| 16 x 4096' | cut -c1-110
(timeout 80 ./bin/gtq_new --include-ignored --test-threads=1 --nocapture > $O/tests_new.txt 2>&1; echo "tests new rc=$? t=$SECONDS") &
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
( for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
    echo "== $SAN $t $k"; timeout 60 $S --tool $t ./bin/gtq_$SAN --include-ignored --exact $k 2>&1; echo "rc=$?"
  done; done > $O/sanitizer.txt; echo "sanitizer t=$SECONDS" ) &
wait
echo "== tests new"; grep -E 'test result|FAILED|panicked' $O/tests_new.txt | head -8
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' $O/sanitizer.txt
ls -la $O
