#!/bin/bash
# issue-9-pdl20 call 3 (2149caa): the decode signals its dependents after its last K/V copies (not at its start), Q
# through ld.global.nc, one CTA per SM under PDL. lean_paged full list, two rounds of base | late --pdl on | late
# --pdl off (FERRATTN_LEAN_FEW=1 build of 2149caa's lean_decode.cu; its SASS of those kernels = the full build's);
# then gpu_lean's Lean device tests on the full build of 2149caa (PDL forced on inside them).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf c3.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-pdl20c
mkdir -p $FERRATTN_CACHE_DIR; rm -rf /tmp/o3; mkdir -p /tmp/o3
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } > /tmp/o3/env.txt 2>&1
P=/tmp/o3/paged.txt; T=/tmp/o3/tests.txt
run() { ts "$*" >> $P; timeout 40 env "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for r in 1 2; do run ./lp_base; run ./lp3_late --pdl on; run ./lp3_late --pdl off; done
(cd /tmp/o3 && tar czf $OUT/call3.tgz *.txt)
ts "== gpu_lean lean_device" >> $T; timeout 40 ./gpu_lean --include-ignored --test-threads=1 lean_device::gpu_device_path_and_paged_kv_match lean_device::gpu_llama_step_in_one_graph_equals_eager 2>&1 | grep -E "^test |test result|panicked|assert|left|right|PDL" >> $T
date -u >> /tmp/o3/env.txt; ts done >> $T
(cd /tmp/o3 && tar czf $OUT/call3.tgz *.txt)
cat /tmp/o3/env.txt $T; grep -E "^\[|rc=[1-9]|^llama|^lean " $P
