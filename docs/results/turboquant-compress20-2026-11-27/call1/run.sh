#!/bin/bash
# issue-10-compress20 call 1: turboquant_compress --only fast,split of main (/work/base-bins20, kernels of a602be2 =
# 3a6d195's compress kernels), new (branch: fast / split compression under PDL, on by default) and new with
# FERRATTN_TQ_PDL=0 (plain stream order), interleaved 3 times (base, new, newoff, ...); gpu_turboquant
# --include-ignored of new; memcheck + racecheck of the two small grids for new; ncu counters of main's 12 fast /
# split kernels at 16 x 4k (the floors).
cd "$(dirname "$0")"
tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $R/device.txt; date -u >> $R/device.txt
cat $R/device.txt
for i in 1 2 3; do for v in base new newoff; do
  echo "== $v $i" >> $R/bench.txt
  if [ $v = newoff ]; then FERRATTN_TQ_PDL=0 timeout 40 ./bin/tqc_new --only fast,split >> $R/bench.txt 2>&1
  else timeout 40 ./bin/tqc_$v --only fast,split >> $R/bench.txt 2>&1; fi
  echo "bench $v $i rc=$? t=$SECONDS"
done; done
grep -E '^==|ceiling|128 \| 16 x 4096 \| (values|keys k4 ).*fast' $R/bench.txt | cut -c1-90
timeout 100 ./bin/gtq_new --include-ignored --test-threads=1 --nocapture > $R/tests.txt 2>&1; echo "tests rc=$? t=$SECONDS"
S=/usr/local/cuda/bin/compute-sanitizer; [ -x $S ] || S=compute-sanitizer
for k in gpu_turboquant_fast_sanitizer_small gpu_turboquant_sanitizer_small; do for t in memcheck racecheck; do
  echo "== $t $k"; timeout 60 $S --tool $t ./bin/gtq_new --include-ignored --exact $k 2>&1; echo "rc=$?"
done; done > $R/sanitizer.txt; echo "sanitizer t=$SECONDS"
echo "== tests"; grep -E 'test result|FAILED|panicked' $R/tests.txt | head -8
grep -E '^==|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' $R/sanitizer.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
M=gpu__time_duration.sum,smsp__cycles_elapsed.avg.per_second,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread
if [ $SECONDS -lt ${LIMIT:-115} ]; then
  timeout 45 $N --clock-control none --kernel-id '::regex:^turboquant_(fast|split)_:25' --metrics $M --csv --page raw \
    ./bin/tqc_base --only fast,split --iters 2 > $R/ncu_base_16x4k.csv 2> $R/ncu_base.err; echo "ncu rc=$? t=$SECONDS"
  grep -c turboquant_ $R/ncu_base_16x4k.csv
else echo "skip ncu t=$SECONDS"; fi
(cd $O && tar czf res.tgz r && rm -rf r)
ls -la $O
