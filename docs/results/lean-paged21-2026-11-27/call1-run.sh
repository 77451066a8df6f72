#!/bin/bash
# issue-9-paged21 call 1: B + D (normal build; the deep ring's SASS is main's) against main (/work/base-bins19/lean_paged):
# lean_paged full list interleaved (base, new) x3, Lean-paper B=4 ctx 16k and Llama B=1 ctx 8k (--contig-on-pool) twice more
# each; tests (gpu_lean without NVRTC, gpu_device_api); memcheck + racecheck on the Lean small grids; per-CTA stamps (stamps
# builds of main's kernels and of B + D, d128 r4 and d64 r1 instances) at Lean-paper B=4 ctx 16k (each storage at its grid,
# and the paged storages at the contiguous grid, --same-plan) and Llama B=1 ctx 8k; PyTorch SDPA; copy ceiling.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf c1.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p21
mkdir -p $FERRATTN_CACHE_DIR; rm -rf /tmp/o; mkdir -p /tmp/o
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > /tmp/o/env.txt 2>&1
P=/tmp/o/paged.txt; T=/tmp/o/tests.txt; Z=/tmp/o/stamps.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
runz() { ts "$*" >> $Z; timeout 40 "$@" >> $Z 2>&1; echo "rc=$?" >> $Z; }
run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new; run ./lp_base; run ./lp_new
for r in 1 2; do for v in lp_base lp_new; do run ./$v --only lean:4:16384; done; done
for r in 1 2; do for v in lp_base lp_new; do run ./$v --contig-on-pool --only llama:1:8192; done; done
ts "== gpu_lean" >> $T; timeout 90 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right" >> $T
ts "== gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
for x in "memcheck gpu_sanitizer_small_grid" "racecheck gpu_sanitizer_small_grid" "memcheck lean_device::gpu_device_sanitizer_small" "racecheck lean_device::gpu_device_sanitizer_small"; do
  set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $1 --error-exitcode 9 ./gpu_lean $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
done
for r in 1 2; do for v in lp_sbase lp_snew; do runz ./$v --only lean:4:16384 --stamps 30 --stamps-out /tmp/o/raw_${v}_lp4_16k_$r.txt; done; done
for v in lp_sbase lp_snew; do runz ./$v --only lean:4:16384 --same-plan --stamps 30 --stamps-out /tmp/o/raw_${v}_lp4_16k_same.txt; done
for v in lp_sbase lp_snew; do runz ./$v --only llama:1:8192 --contig-on-pool --stamps 120 --stamps-out /tmp/o/raw_${v}_l1_8k.txt; done
for f in /tmp/o/raw_*lp4*.txt; do echo "== $f" >> /tmp/o/ana.txt; python3 ana21.py $f >> /tmp/o/ana.txt 2>&1; done
for f in /tmp/o/raw_*l1_8k.txt; do echo "== $f" >> /tmp/o/ana.txt; python3 ana.py $f "contig,p16 ord,p64 ord,p16,p64" >> /tmp/o/ana.txt 2>&1; python3 ana21.py $f >> /tmp/o/ana.txt 2>&1; done
xz -T8 -6 /tmp/o/raw_lp_sbase_lp4_16k_1.txt /tmp/o/raw_lp_snew_lp4_16k_1.txt; rm -f /tmp/o/raw_*.txt
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-lean.json /tmp/o/sdpa.json > /tmp/o/sdpa.txt 2>&1
python3 -c "
import torch;x=torch.empty(1<<30,dtype=torch.uint8,device='cuda');y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
s=torch.cuda.Event(True);e=torch.cuda.Event(True);ts=[]
for _ in range(10):
  s.record();y.copy_(x);e.record();torch.cuda.synchronize();ts.append(s.elapsed_time(e))
ts.sort();print('copy ceiling GB/s (read+write, median of 10):',2*(1<<30)/ts[5]/1e6)" >> /tmp/o/env.txt 2>&1
date -u >> /tmp/o/env.txt; ts done >> $T
(cd /tmp/o && tar cf - *.txt *.json *.xz | cat > $OUT/call1.tar)
cat /tmp/o/env.txt $T; grep -E "^\[|rc=[1-9]|^llama|^lean " $P; cat /tmp/o/ana.txt | head -80; grep -E "sdpa|cudnn|flash" /tmp/o/sdpa.txt | head -12
