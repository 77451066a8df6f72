#!/bin/bash
# issue-9-pdl20 call 2 (c9d4657's host code): where call 1's losses come from. lean_paged full list, two rounds of
# base | cg pdl off (probe) | cg FERRATTN_LEAN_PDL=0 (no probe) | cg pdl on (one CTA per SM) | cg pdl on spread off |
# qnc FERRATTN_LEAN_PDL=0 | qnc pdl on; cg = the PDL kernels (Q through L2), qnc = the same with Q through ld.global.nc
# (FERRATTN_LEAN_FEW=1 builds: f16 d128 r4 and d64 r1 only; their SASS of those kernels equals the full build's).
# Then gpu_lean (full kernels, c9d4657 host code).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf c2.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-pdl20b
mkdir -p $FERRATTN_CACHE_DIR; rm -rf /tmp/o2; mkdir -p /tmp/o2
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } > /tmp/o2/env.txt 2>&1
P=/tmp/o2/paged.txt; T=/tmp/o2/tests.txt
run() { ts "$*" >> $P; timeout 40 env "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2; do
  run ./lp_base; run ./lp2_cg --pdl off; run FERRATTN_LEAN_PDL=0 ./lp2_cg; run ./lp2_cg --pdl on
  run FERRATTN_LEAN_PDL_SPREAD=0 ./lp2_cg --pdl on; run FERRATTN_LEAN_PDL=0 ./lp2_qnc; run ./lp2_qnc --pdl on
done
ts "== gpu_lean" >> $T; timeout 60 ./gpu_lean --include-ignored --test-threads=1 --skip nvrtc 2>&1 | grep -E "^test |test result|panicked|assert|left|right|PDL" >> $T
date -u >> /tmp/o2/env.txt; ts done >> $T
(cd /tmp/o2 && tar czf $OUT/call2.tgz *.txt)
cat /tmp/o2/env.txt $T; grep -E "^\[|rc=[1-9]|^llama|^lean |in force: false" $P | grep -v "in force" | head -150
