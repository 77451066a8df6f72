#!/bin/bash
# issue-10-compress11 call 1: ncu of main's (1a4e7dc) fast compression kernels at 16 x 4k
# (launch 22 of each kernel name: 21 launches at 1 x 32k come first with --iters 2).
cd "$(dirname "$0")"
tar xJf bins1.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
O=${OUT:-/tmp/out}; mkdir -p $O/ncu
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total,driver_version --format=csv > $O/device.txt; date -u >> $O/device.txt
cat $O/device.txt
N=/usr/local/cuda/bin/ncu; [ -x $N ] || N=ncu
M=smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fmaheavy.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum,smsp__warps_active.avg.per_cycle_active
for k in values_d128 keys_mse_d128 keys_qjl_d128 values_d64; do
  timeout 60 $N --clock-control none -k turboquant_fast_$k -s 21 -c 1 --import-source no \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section ComputeWorkloadAnalysis --section InstructionStats --metrics $M \
    -o $O/ncu/$k ./bin/tqc_main --only fast --iters 2 > $O/ncu/${k}.log 2>&1
  echo "ncu $k rc=$? t=$SECONDS"
  $N -i $O/ncu/$k.ncu-rep --page source --csv --print-source sass > $O/ncu/${k}_sass.csv 2>&1
  $N -i $O/ncu/$k.ncu-rep --page details --print-details all > $O/ncu/${k}_details.txt 2>&1
  $N -i $O/ncu/$k.ncu-rep --page raw --csv > $O/ncu/${k}_raw.csv 2>&1
  rm -f $O/ncu/$k.ncu-rep
  grep -E 'Grid Size|Duration|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|DRAM Throughput|No Eligible|Achieved Occ' $O/ncu/${k}_details.txt | head -10
done
(cd $O && tar cJf ncu.tar.xz ncu && rm -rf ncu)
ls -la $O
