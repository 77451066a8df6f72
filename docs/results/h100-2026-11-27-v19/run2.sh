#!/bin/bash
# Lead, nineteenth session, call 2 (H100): the merged tree 131f4f5's decodes against main 3a6d195's (/work/base-bins19):
# TurboAttention decode (decode19's balanced cut) and TurboQuant decode (decode19's prepare / merge), two rounds each
# alternated, SDPA in the same call; gpu_turbo decode and gpu_turboquant on the merged binaries.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b2.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l19h
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o19h; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "new: main 131f4f5 (merged); base: main 3a6d195"; } > $I
SH="1 16384 4 16384 16 16384 8 32768 64 4096 32 32768"
for rep in 1 2; do
  if [ $rep = 2 ]; then order="td_new td_base"; else order="td_base td_new"; fi
  for b in $order; do timeout 60 ./$b $SH --only default 2>&1 | sed "s/^/$b$rep /" >> $W/decode.txt; done
  echo "$(ts) turbo decode round $rep" >> $I
done
C=k2-v2,k3-v2,k3q-v2,k4q-v3
for rep in 1 2; do
  if [ $rep = 2 ]; then order="tq_new tq_base"; else order="tq_base tq_new"; fi
  for s in "1 32768 --sets 4" "16 16384 --sets 2" "32 32768 --sets 1"; do
    for b in $order; do echo "-- $b$rep $s" >> $W/tq.txt; timeout 60 ./$b $s --config $C 2>&1 | grep -E "turboquant|copy|error|panick" >> $W/tq.txt; done; done
  echo "$(ts) tq decode round $rep" >> $I
done
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-decode.json $W/sdpa_decode.json > $W/sdpa_decode.txt 2>&1; echo "$(ts) sdpa decode rc=$?" >> $I
timeout 60 python3 $R/scripts/bench_sdpa.py jobs-tq.json $W/sdpa_tq.json > $W/sdpa_tq.txt 2>&1; echo "$(ts) sdpa tq rc=$?" >> $I
timeout 120 ./gpu_turbo decode --include-ignored --test-threads=1 > $W/t_turbo_decode.txt 2>&1; echo "$(ts) gpu_turbo decode rc=$?: $(grep 'test result' $W/t_turbo_decode.txt | tail -1)" >> $I
timeout 120 ./gpu_turboquant --include-ignored --test-threads=1 > $W/t_tq.txt 2>&1; echo "$(ts) gpu_turboquant rc=$?: $(grep 'test result' $W/t_tq.txt | tail -1)" >> $I
date -u >> $I; cd $W && tar czf $OUT/l19h.tgz *; cat $I
grep -E "mixed|int4" $W/decode.txt | grep -iE "B=64|64 x 4096|64x4" | head -8
grep -E "^--|16 x 16384|32 x 32768" $W/tq.txt | head -30
for f in $W/sdpa_decode.txt $W/sdpa_tq.txt; do grep -v Warning $f | tail -7; done
