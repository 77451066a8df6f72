#!/bin/bash
# issue-10-compress20 call 3: turboquant_compress --only fast,split of main (/work/base-bins20) and hyb (863187a: the
# fast d 128 QJL-key kernel = 127ba66's SASS, the other 11 = 90ff11d's), interleaved 3 times; memcheck + racecheck of
# the two small grids for hyb; gpu_turboquant --include-ignored fast (the tests of the fast / split kernels) of hyb.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $R/device.txt; date -u >> $R/device.txt
cat $R/device.txt
for i in 1 2 3; do for v in base hyb; do
  echo "== $v $i" >> $R/bench.txt
  timeout 30 ./bin/tqc_$v --only fast,split >> $R/bench.txt 2>&1
  echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|128 \| (16|64) x 1 token \| fast|128 \| 16 x 4096 \| keys k4q.*fast' $R/bench.txt | cut -c1-90
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  echo "== $t $k"; timeout 30 $S --tool $t ./bin/gtq_hyb --include-ignored --exact $k 2>&1; echo "rc=$?"
done; done > $R/sanitizer.txt; echo "sanitizer t=$SECONDS"
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' $R/sanitizer.txt
timeout $((52 - SECONDS)) ./bin/gtq_hyb --include-ignored --test-threads=1 --nocapture fast > $R/tests.txt 2>&1; echo "tests rc=$? t=$SECONDS"
echo "== tests"; grep -E '^test |test result|FAILED|panicked' $R/tests.txt | cut -c1-120 | head -12
(cd $O && tar czf res.tgz r && rm -rf r)
