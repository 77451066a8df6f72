#!/usr/bin/env bash
# issue 11 decode2, device call 1: ncu of the g4 decode (16x16k INT4 / mixed, 1x16k), units sweep over the 1 GB rows, SDPA same call.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
W=/tmp/w; mkdir -p $W
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; ncu --version | tail -1; } | tee $W/sweep.txt
T0=$SECONDS
SEC="--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis --section SourceCounters"
for bits in int4 mixed; do
  timeout 90 ncu --clock-control none -k regex:turbo_decode_g4 -c 1 $SEC --metrics smsp__inst_executed.sum,dram__bytes_read.sum,smsp__cycles_active.avg -o $W/ncu16-$bits $S/turbo_decode-base 16 16384 --bits $bits --only g4 --iters 1 > $W/ncu16-$bits.log 2>&1
  echo "ncu $bits rc=$? $((SECONDS-T0)) s"
  ncu -i $W/ncu16-$bits.ncu-rep --print-details all > $W/ncu16-$bits.txt 2>&1
  ncu -i $W/ncu16-$bits.ncu-rep --page raw --csv > $W/ncu16-$bits-raw.csv 2>&1
  ncu -i $W/ncu16-$bits.ncu-rep --page source --csv --print-source sass > $W/ncu16-$bits-sass.csv 2>&1 || echo "source page failed"
done
timeout 60 ncu --clock-control none -k regex:"turbo_(decode_g4|combine)" -c 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --metrics smsp__inst_executed.sum -o $W/ncu1 $S/turbo_decode-base 1 16384 --bits int4 --only g4 --iters 1 > $W/ncu1.log 2>&1
echo "ncu b1 rc=$? $((SECONDS-T0)) s"
ncu -i $W/ncu1.ncu-rep --print-details all > $W/ncu1.txt 2>&1
grep -E "Duration|Registers Per|Achieved Occ|Theoretical Occ|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |DRAM Throughput|Memory Throughput|Block Limit" $W/ncu16-int4.txt $W/ncu16-mixed.txt $W/ncu1.txt
timeout 150 $S/turbo_decode-base 64 4096 16 16384 8 32768 --only g4 --units auto,1056,1320,1452,2112 2>&1 | tee -a $W/sweep.txt
echo "sweep $((SECONDS-T0)) s"
timeout 60 $S/turbo_decode-base 1 16384 1 32768 32 32768 --only g4 2>&1 | tee -a $W/sweep.txt
timeout 120 python3 $S/bench_sdpa.py $S/jobs.json $W/sdpa.json 2>&1 | tail -n 30 | tee -a $W/sweep.txt
echo "total $((SECONDS-T0)) s"
cd /tmp && tar cJf $OUT/call1.tar.xz w && ls -la $OUT
