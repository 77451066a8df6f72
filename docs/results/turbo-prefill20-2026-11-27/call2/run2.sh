#!/bin/bash
# issue-11-prefill20 (helper), call 2 (diagnostics, timing only): the share of the O registers shifted by IMAD.HI,
# e0 (none: round 20's code with every register by SHF), e4 (1 in 4), e8 (1 in 8), new (1 in 2, call 1's), against
# main a602be2 (base-bins20), 4 x 4096 and 1 x 32768 non-causal uniform, three rounds; then per-CTA timelines of
# main's kernel built with FERRATTN_WGF_TIMELINE=1 (tlmain) and with FERRATTN_WGF_NO_SHIFT=1 too (tlnoshift).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; tar xJf b2.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p20
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o20b; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "main: a602be2; new/e*: issue-11-prefill20 $(cat commit.txt)"; } > $I
SH="4 4096 1 32768 --causal no --only fast --inputs uniform"
n=0; for b in main e0 e4 e8 new new e8 e4 e0 main main e0 e4 e8; do
  n=$((n+1)); timeout 20 ./turbo_prefill_$b $SH > $W/bench_${b}_$n.txt 2>&1; echo "$(ts) bench $b $n rc=$?" >> $I; done
for t in tlmain tlnoshift; do
  FERRATTN_WGF_TRACE=1 timeout 25 ./turbo_prefill_$t 4 4096 1 32768 --causal no --only fast --inputs uniform --trace $W/$t > $W/${t}_bench.txt 2>&1; echo "$(ts) $t rc=$?" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/p20b.tgz *; cat $I
for f in $W/bench_* $W/tl*_bench.txt; do echo "$(basename $f) $(grep -o 'fast: .* ms total' $f | tr '\n' ' ')"; done
