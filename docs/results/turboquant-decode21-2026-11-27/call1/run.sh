#!/bin/bash
# issue-10-decode21 call 1: ncu profile of main's decode kernel (base-bins20, main a602be2's kernels) at 32 x 32k,
# k4q-v3, k3q-v2 and k2-v2: pipe utilisation, stall reasons, warps eligible, SASS-level stall hot spots.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf call1.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
R=$OUT/r; mkdir -p $R
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } | tee $R/env.txt
for c in k4q-v3 k2-v2 k3q-v2; do
  timeout 150 ncu --clock-control none -k "regex:turboquant_decode" -c 1 --import-source no \
    --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section SourceCounters \
    --section InstructionStats --section LaunchStats --section Occupancy --section SpeedOfLight \
    -o $R/ncu_$c ./tq_main 32 32768 --config $c --iters 1 > $R/ncu_run_$c.txt 2>&1
  echo "rc=$?" >> $R/ncu_run_$c.txt; ts "ncu $c" >> $R/env.txt
  ncu -i $R/ncu_$c.ncu-rep --page details --print-details all > $R/details_$c.txt 2>&1
  ncu -i $R/ncu_$c.ncu-rep --page raw --csv > $R/raw_$c.csv 2>&1
  ncu -i $R/ncu_$c.ncu-rep --page source --csv --print-source sass > $R/sass_$c.csv 2>&1
  ts "export $c" >> $R/env.txt
  [ $(( $(date +%s) - S )) -gt 200 ] && break
done
rm -f $R/*.ncu-rep
cd $OUT && tar czf call1.tgz r && rm -rf r
ls -la $OUT
