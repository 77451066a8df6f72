#!/bin/bash
# Sixteenth session (issue 9, Lean paged), call 2: branch issue-9-paged16's final rules (the deep instance at head dim
# 64 on grids of one CTA per SM; plan_paged gives head dim 64 plan's grids, so Lean-paper B=4 ctx 16k runs paged on
# 112 CTAs) against main 1eb66ef's lean_paged, interleaved base, new, base, new at the planners' grids (timings alone
# on the GPU); then gpu_lean's device-path tests (every PagedRead against contiguous bit for bit; the graph test).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
mkdir -p /tmp/b2; xz -dc -T4 bins2.tar.xz | tar xf - -C /tmp/b2; chmod +x /tmp/b2/*; ts unpacked
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; cat COMMIT2; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
run() { ts "$*" >> $P; timeout 30 "$@" >> $P 2>&1; echo "rc=$?" >> $P; }
for v in base new base new; do run /tmp/b2/lean_paged_$v --out /tmp/c2-$v-full-$(date +%s%N).json; done
(cd /tmp && tar czf $OUT/json.tgz c2-*.json)
grep -v '^$' $P
T=$OUT/tests.txt
ts "gpu_lean lean_device::" >> $T; timeout 60 /tmp/b2/gpu_lean --include-ignored --test-threads=1 lean_device:: 2>&1 | grep -E "^test |test result|panicked|assert" >> $T; echo "rc=${PIPESTATUS[0]}" >> $T
cat $T; ts done
