#!/bin/bash
# issue-9-paged20 call 1: per-CTA stamps (FERRATTN_LEAN_STAMPS=1 build of the branch, f16 d128 r4 only) on
# Llama B=1 ctx 8k (--contig-on-pool: contiguous and in-order paged on the same memory), B=8 ctx 8k, B=64 ctx 1k,
# B=1 ctx 32k.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf c1.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
mkdir -p /tmp/o; { date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; } > /tmp/o/env.txt 2>&1
P=/tmp/o/stamps.txt
run() { ts "$*" >> $P; timeout 60 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
run ./lp_stamps --only llama:1:8192 --contig-on-pool --stamps 200 --stamps-out /tmp/o/raw_l1_8k.txt
run ./lp_stamps --only llama:8:8192 --stamps 100 --stamps-out /tmp/o/raw_l8_8k.txt
run ./lp_stamps --only llama:64:1024 --stamps 40
run ./lp_stamps --only llama:1:32768 --contig-on-pool --stamps 100 --stamps-out /tmp/o/raw_l1_32k.txt
python3 -c "
import torch;x=torch.empty(1<<30,dtype=torch.uint8,device='cuda');y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
s=torch.cuda.Event(True);e=torch.cuda.Event(True);ts=[]
for _ in range(10):
  s.record();y.copy_(x);e.record();torch.cuda.synchronize();ts.append(s.elapsed_time(e))
ts.sort();print('copy ceiling GB/s (read+write, median of 10):',2*(1<<30)/ts[5]/1e6)" >> /tmp/o/env.txt 2>&1
date -u >> /tmp/o/env.txt; ts done >> $P
(cd /tmp/o && tar cf - *.txt | xz -6 -T8 > $OUT/call1.tar.xz; ls -la /tmp/o $OUT)
cat /tmp/o/env.txt; grep -v "^rc=0" $P
