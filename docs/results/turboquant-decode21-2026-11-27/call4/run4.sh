#!/bin/bash
# Helper, twentieth session, issue-10-decode21, call 4: the tip 5e41055 (late P·V for crumb values at d 128 only)
# against main's turboquant_decode (tq_base: /work/base-bins20, main a602be2's kernels), three alternated rounds at
# d 128, 1 x 32k, 16 x 16k, 32 x 32k (k4q-v3 runs main's kernels on both sides: control). No SDPA (call 3's).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf bins4.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d21
mkdir -p $FERRATTN_CACHE_DIR; mkdir -p $OUT/r; O=$OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT4; } | tee $O/env.txt
run() { echo "-- $*"; env "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C=k2-v2,k3-v2,k3q-v2,k4q-v3
{ for rep in 1 2 3; do
  if (( rep % 2 )); then A=tq_base; Z=tq_new; else A=tq_new; Z=tq_base; fi
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    run timeout 60 ./$A $s --config $C; run timeout 60 ./$Z $s --config $C; done
done; } > $O/tq.txt 2>&1
ts bench done >> $O/env.txt; date -u >> $O/env.txt
python3 summarize.py $O/tq.txt > $O/summary.txt
cp run4.sh summarize.py COMMIT4 $O/; tar czf $OUT/d21call4.tgz -C $OUT r
cat $O/env.txt; cat $O/summary.txt
