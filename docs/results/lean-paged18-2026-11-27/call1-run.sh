#!/bin/bash
# issue-9-paged18 call 1: where the paged Lean kernel's time goes (ncu of one contiguous and one paged launch,
# Llama B=1 ctx 8k pages of 16 in order with both storages on the same memory, and Lean-paper B=4 ctx 16k at the
# planners' grids), and a first timing: base (main 1a4e7dc) lean_paged default and --same-plan, new --contig-on-pool.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf lp.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; ncu --version | tail -1; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/timing.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
run ./lp_base; run ./lp_new --contig-on-pool; run ./lp_base --same-plan; run ./lp_new --contig-on-pool; run ./lp_base
# copy ceiling: a 1 GiB device copy (read + write)
python3 -c "
import torch;x=torch.empty(1<<30,dtype=torch.uint8,device='cuda');y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
s=torch.cuda.Event(True);e=torch.cuda.Event(True);ts=[]
for _ in range(10):
  s.record();y.copy_(x);e.record();torch.cuda.synchronize();ts.append(s.elapsed_time(e))
ts.sort();print('copy ceiling GB/s (read+write, median of 10):',2*(1<<30)/ts[5]/1e6)" >> $P 2>&1
mkdir -p /tmp/rep; N=$OUT/ncu.txt
prof() { tag=$1; only=$2; kern=$3; skip=$4; shift 4
  ts "ncu $tag" >> $N
  timeout 45 ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SourceCounters --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    -k "regex:^${kern}\$" --launch-skip $skip --launch-count 1 -o /tmp/rep/$tag -f ./lp_new --only $only "$@" > /tmp/rep/$tag.log 2>&1; echo "rc=$?" >> $N
  ncu --import /tmp/rep/$tag.ncu-rep --page details >> $N 2>&1
  ncu --import /tmp/rep/$tag.ncu-rep --page source --csv --print-source sass > /tmp/rep/$tag.sass.csv 2>&1
}
prof llama8k_contig llama:1:8192 lean_decode_f16_d128_r4 12 --contig-on-pool
prof llama8k_p16o llama:1:8192 lean_decode_paged_regs_f16_d128_r4 60 --contig-on-pool
prof lean4_contig lean:4:16384 lean_decode_f16_d64_r1 10
prof lean4_p16o lean:4:16384 lean_decode_paged_regs_f16_d64_r1 50
(cd /tmp/rep && tar cJf $OUT/ncu-reps.tar.xz *.ncu-rep *.log *.sass.csv)
ts done >> $N
grep -E "^\[|rc=|llama|lean |copy" $P; grep -E "^\[|rc=|Duration|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Stall|Elapsed Cycles" $N | head -60
