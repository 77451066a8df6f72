#!/bin/bash
# issue-9-pdl20 call 1: the Lean decode under programmatic dependent launch (PDL) against main a602be2
# (/work/base-bins20/lean_paged). lean_paged full list interleaved (base, new --pdl on, new --pdl off) x3; Llama B=1
# ctx 8k and Lean-paper B=4 ctx 16k twice more each; tests (gpu_lean without NVRTC, gpu_device_api); memcheck +
# racecheck on the Lean small grids; stamps (if a stamps build is in the bundle); PyTorch SDPA; copy ceiling.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf c1.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-pdl20
mkdir -p $FERRATTN_CACHE_DIR; rm -rf /tmp/o; mkdir -p /tmp/o
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > /tmp/o/env.txt 2>&1
P=/tmp/o/paged.txt; T=/tmp/o/tests.txt; Z=/tmp/o/stamps.txt
run() { ts "$*" >> $P; timeout 40 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2 3; do run ./lp_base; run ./lp_new --pdl on; run ./lp_new --pdl off; done
for r in 1 2; do for o in llama:1:8192 lean:4:16384; do run ./lp_base --only $o; run ./lp_new --pdl on --only $o; run ./lp_new --pdl off --only $o; done; done
ts "== gpu_lean" >> $T; timeout 120 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED|left|right|PDL" >> $T
ts "== gpu_device_api" >> $T; timeout 60 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "== gpu_device_api FERRATTN_LEAN_PDL=0" >> $T; FERRATTN_LEAN_PDL=0 timeout 60 ./gpu_device_api --include-ignored --test-threads=1 facade 2>&1 | grep -E "test result|panicked" >> $T
san() { for x in "$@"; do
  set -- $x
  FERRATTN_GPU_TEST_SCALE=small timeout $3 compute-sanitizer --tool $1 --error-exitcode 9 ./gpu_lean $2 --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1; rc=$?
  echo "$(ts) $1 $2 rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt) $(grep -m1 'test result' /tmp/san.txt)" >> $T
done; }
san "memcheck gpu_sanitizer_small_grid 60" "racecheck gpu_sanitizer_small_grid 60" "memcheck lean_device::gpu_device_sanitizer_small 60"
if [ -x ./lp_stamps ]; then
  for pdl in on off; do ts "stamps pdl $pdl" >> $Z; timeout 40 ./lp_stamps --pdl $pdl --only llama:1:8192 --contig-on-pool --stamps 60 >> $Z 2>&1; echo rc=$? >> $Z; done
fi
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-lean.json /tmp/o/sdpa.json > /tmp/o/sdpa.txt 2>&1
python3 -c "
import torch;x=torch.empty(1<<30,dtype=torch.uint8,device='cuda');y=torch.empty_like(x)
for _ in range(3): y.copy_(x)
s=torch.cuda.Event(True);e=torch.cuda.Event(True);ts=[]
for _ in range(10):
  s.record();y.copy_(x);e.record();torch.cuda.synchronize();ts.append(s.elapsed_time(e))
ts.sort();print('copy ceiling GB/s (read+write, median of 10):',2*(1<<30)/ts[5]/1e6)" >> /tmp/o/env.txt 2>&1
(cd /tmp/o && tar czf $OUT/call1.tgz *.txt *.json)
san "racecheck lean_device::gpu_device_sanitizer_small 120"
date -u >> /tmp/o/env.txt; ts done >> $T
(cd /tmp/o && tar czf $OUT/call1.tgz *.txt *.json)
cat /tmp/o/env.txt $T; grep -E "^\[|rc=[1-9]|^llama|^lean |in force" $P | head -120; grep -E "span|entry ->|stage 0|per later|^stamps" $Z 2>/dev/null | head -60; grep -E "sdpa|cudnn|flash" /tmp/o/sdpa.txt | head -12
