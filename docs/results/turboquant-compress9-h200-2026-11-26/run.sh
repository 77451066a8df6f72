#!/bin/bash
# issue-10-compress9, device call: turboquant_compress --only fast,split of main (1b71e75's kernels,
# built in this branch's worktree before any change) and the branch's variants ($V: d = 7675857,
# the {count, boundary} entry; new = the wide grid on top) interleaved twice, each run with its own
# copy ceiling; gpu_turboquant --include-ignored of main and the variants (printed lines compared:
# the same codes); memcheck + racecheck of the two small grids for the last variant.
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
V=${V:-"d new"}; SAN=${SAN:-new}
for i in 1 2; do for v in main $V; do
  echo "== $v $i" >> $O/bench.txt
  timeout 30 ./bin/tqc_$v --only fast,split >> $O/bench.txt 2>&1; echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|\| (fast|split) ' $O/bench.txt | grep -E '^==|ceiling|128 \| 16 x 4096' | cut -c1-110
for v in main $V; do
  (timeout 50 ./bin/gtq_$v --include-ignored --test-threads=1 --nocapture > $O/tests_$v.txt 2>&1; echo "tests $v rc=$? t=$SECONDS") &
done
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
( for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
    echo "== $SAN $t $k"; timeout 40 $S --tool $t ./bin/gtq_$SAN --include-ignored --exact $k 2>&1
  done; done > $O/sanitizer.txt; echo "sanitizer t=$SECONDS" ) &
wait
for v in main $V; do echo "== tests $v"; grep -E 'test result|FAILED|panicked' $O/tests_$v.txt | head -5; done
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY' $O/sanitizer.txt
for v in main $V; do grep -vE '^(running|test |Running|$)|finished in|test result' $O/tests_$v.txt | sort > $O/lines_$v.txt; done
for v in $V; do echo "printed lines main $(wc -l < $O/lines_main.txt) $v $(wc -l < $O/lines_$v.txt); diff:"; diff $O/lines_main.txt $O/lines_$v.txt | head -20; done
(cd $O && tar cJf tests.tar.xz tests_*.txt lines_*.txt && rm tests_*.txt lines_*.txt)
ls -la $O
