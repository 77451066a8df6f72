#!/bin/bash
# issue-9-paged20 call 3: D (the REGS owner warp's per-stage word fetch shortened, heads_kv read once) against main 3a6d195
# (/work/base-bins19/lean_paged). Tests of D (gpu_lean without NVRTC, gpu_device_api), memcheck + racecheck on the Lean small
# grids, lean_paged full list interleaved (base, new) x3, --contig-on-pool at Llama B=1 ctx 8k, per-CTA stamps (stamps builds of
# base, D and B+D), PyTorch SDPA on the list's shapes, copy ceiling.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf c3.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p20
mkdir -p $FERRATTN_CACHE_DIR; rm -rf /tmp/o; mkdir -p /tmp/o
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > /tmp/o/env.txt 2>&1
P=/tmp/o/paged.txt; T=/tmp/o/tests.txt; Z=/tmp/o/stamps.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
runz() { ts "$*" >> $Z; timeout 40 "$@" >> $Z 2>&1; echo "rc=$?" >> $Z; }
run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new
for r in 1 2; do run ./lp_base --contig-on-pool --only llama:1:8192; run ./lp_new --contig-on-pool --only llama:1:8192; done
ts "== gpu_lean" >> $T; timeout 90 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right" >> $T
ts "== gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
for x in "memcheck gpu_sanitizer_small_grid" "racecheck gpu_sanitizer_small_grid" "memcheck lean_device::gpu_device_sanitizer_small" "racecheck lean_device::gpu_device_sanitizer_small"; do
  set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $1 --error-exitcode 9 ./gpu_lean $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
done
for r in 1 2; do for v in lp_stamps lp_stampsD lp_stampsBD; do runz ./$v --only llama:1:8192 --contig-on-pool --stamps 120 --stamps-out /tmp/o/raw_${v}_l1_8k_$r.txt; done; done
for v in lp_stamps lp_stampsD lp_stampsBD; do runz ./$v --only llama:8:8192 --stamps 40 --stamps-out /tmp/o/raw_${v}_l8_8k.txt; done
for f in /tmp/o/raw_*.txt; do echo "== $f" >> /tmp/o/ana.txt; python3 ana.py $f "contig,p16 ord,p64 ord,p16,p64" >> /tmp/o/ana.txt 2>&1; done; rm -f /tmp/o/raw_*.txt
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-lean.json /tmp/o/sdpa.json > /tmp/o/sdpa.txt 2>&1
python3 -c "
import torch;x=torch.empty(1<<30,dtype=torch.uint8,device='cuda');y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
s=torch.cuda.Event(True);e=torch.cuda.Event(True);ts=[]
for _ in range(10):
  s.record();y.copy_(x);e.record();torch.cuda.synchronize();ts.append(s.elapsed_time(e))
ts.sort();print('copy ceiling GB/s (read+write, median of 10):',2*(1<<30)/ts[5]/1e6)" >> /tmp/o/env.txt 2>&1
run ./lp_base; run ./lp_new
date -u >> /tmp/o/env.txt; ts done >> $T
(cd /tmp/o && tar cf - *.txt *.json | xz -6 -T8 > $OUT/call3.tar.xz)
cat /tmp/o/env.txt $T; grep -E "^\[|rc=[1-9]|^llama|^lean " $P; grep -E "^llama" $Z; grep -E "sdpa|cudnn|flash" /tmp/o/sdpa.txt | head -12
