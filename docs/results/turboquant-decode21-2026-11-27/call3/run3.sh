#!/bin/bash
# Helper, twentieth session, issue-10-decode21, call 3: branch a15f4cb (the late P·V at d 128 only; its d 128
# decode kernels' SASS is identical to 1b9393b's, tested in call 2, and its d 64 decode SASS to main's, by
# cuobjdump digest) against main's turboquant_decode (tq_base: /work/base-bins20/turboquant_decode, main a602be2's
# kernels), four alternated rounds (order swapped every round) at d 128 and two at d 64 (control: the same d 64
# kernels on both sides), 1 x 32k, 16 x 16k, 32 x 32k; SDPA in the same call.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins3.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d21
mkdir -p $FERRATTN_CACHE_DIR; mkdir -p $OUT/r; O=$OUT/r
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT3; } | tee $O/env.txt
run() { echo "-- $*"; env "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C=k2-v2,k3-v2,k3q-v2,k4q-v3
{ for rep in 1 2 3 4; do
  if (( rep % 2 )); then A=tq_base; Z=tq_new; else A=tq_new; Z=tq_base; fi
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    run timeout 60 ./$A $s --config $C; run timeout 60 ./$Z $s --config $C; done
  if (( rep <= 2 )); then for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    run timeout 60 ./$A $s --config $C --head-dim 64; run timeout 60 ./$Z $s --config $C --head-dim 64; done; fi
done; } > $O/tq.txt 2>&1
ts bench done >> $O/env.txt
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $O/sdpa.json > $O/sdpa.txt 2>&1
ts sdpa done >> $O/env.txt
date -u >> $O/env.txt
python3 summarize.py $O/tq.txt > $O/summary.txt
cp run3.sh summarize.py COMMIT3 $O/; tar czf $OUT/d21call3.tgz -C $OUT r
cat $O/env.txt; grep -v Warning $O/sdpa.txt | tail -4; cat $O/summary.txt
