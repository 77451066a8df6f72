#!/bin/bash
# issue-11-prefill20 (helper), call 4: ncu durations of the pre-pass kernels (turbo_quant_q_*, turbo_quant_kv_*) and the
# attention kernel of main's bench, 4 x 4096 and 1 x 32768 non-causal uniform (the first launches of each).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; [ -x turbo_prefill_main ] || tar xJf b2.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p20
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o20d; mkdir -p $W; I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } > $I
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for s in "4 4096" "1 32768"; do set -- $s
  timeout 30 $NCU --clock-control none -k regex:"turbo_(quant_q|quant_kv|prefill_wgf)" -c 6 --metrics gpu__time_duration.sum,dram__bytes.sum ./turbo_prefill_main $1 $2 --causal no --only fast --inputs uniform > $W/ncu_pre_$1x$2.txt 2>&1; echo "ncu $1 x $2 rc=$?" >> $I
done
date -u >> $I; cd $W && tar czf $OUT/p20d.tgz *; cat $I; grep -E "turbo_|gpu__time|dram__bytes" $W/ncu_pre_*.txt
