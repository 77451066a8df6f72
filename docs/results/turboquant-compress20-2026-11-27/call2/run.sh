#!/bin/bash
# issue-10-compress20 call 2: turboquant_compress --only fast,split of main (/work/base-bins20), new (127ba66: PDL,
# launch_dependents first thing; call 1's binary) and late (90ff11d: launch_dependents after the prologue), interleaved
# 3 times (base, new, late, ...); gpu_turboquant --include-ignored of late; memcheck + racecheck of the two small grids for late.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $R/device.txt; date -u >> $R/device.txt
cat $R/device.txt
for i in 1 2 3; do for v in base new late; do
  echo "== $v $i" >> $R/bench.txt
  timeout 40 ./bin/tqc_$v --only fast,split >> $R/bench.txt 2>&1
  echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|128 \| (16|64) x 1 token \| fast' $R/bench.txt | cut -c1-90
timeout 100 ./bin/gtq_late --include-ignored --test-threads=1 --nocapture > $R/tests.txt 2>&1; echo "tests rc=$? t=$SECONDS"
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  echo "== $t $k"; timeout 60 $S --tool $t ./bin/gtq_late --include-ignored --exact $k 2>&1; echo "rc=$?"
done; done > $R/sanitizer.txt; echo "sanitizer t=$SECONDS"
echo "== tests"; grep -E 'test result|FAILED|panicked' $R/tests.txt | head -8
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' $R/sanitizer.txt
(cd $O && tar czf res.tgz r && rm -rf r)
ls -la $O
