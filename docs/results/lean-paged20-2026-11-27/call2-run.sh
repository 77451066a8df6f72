#!/bin/bash
# issue-9-paged20 call 2: per-CTA stamps, base (main's kernels + stamps) vs A (record loads first) vs B (A + unit 0's
# words in registers), interleaved, Llama B=1 ctx 8k --contig-on-pool and B=8 ctx 8k.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf c2.tar.xz; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
rm -rf /tmp/o; mkdir -p /tmp/o; { date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } > /tmp/o/env.txt 2>&1
P=/tmp/o/stamps.txt
run() { ts "$*" >> $P; timeout 60 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2; do for v in lp_stamps lp_stampsA lp_stampsB; do
  run ./$v --only llama:1:8192 --contig-on-pool --stamps 150 --stamps-out /tmp/o/raw_${v}_l1_8k_$r.txt
done; done
for v in lp_stamps lp_stampsA lp_stampsB; do run ./$v --only llama:8:8192 --stamps 60 --stamps-out /tmp/o/raw_${v}_l8_8k.txt; done
for v in lp_stamps lp_stampsA lp_stampsB; do run ./$v --only llama:64:1024 --stamps 20 --stamps-out /tmp/o/raw_${v}_l64_1k.txt; done
date -u >> /tmp/o/env.txt; ts done >> $P
for f in /tmp/o/raw_*.txt; do echo "== $f" >> /tmp/o/ana.txt; python3 ana.py $f "contig,p16 ord,p64 ord,p16,p64" >> /tmp/o/ana.txt 2>&1; done
(cd /tmp/o && tar cf - env.txt stamps.txt ana.txt raw_lp_stampsB_l1_8k_1.txt | xz -6 -T8 > $OUT/call2.tar.xz); ls -la $OUT
cat /tmp/o/env.txt; grep -E "^\[|^llama|rc=[1-9]" $P
