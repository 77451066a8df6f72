#!/usr/bin/env bash
# issue 11 decode14, call 2: the same two binaries as call 1 (base = main a005076's turbo_decode, new = 8b56b83), five
# rounds with the order swapped every round (base/new, new/base, ...), to tell INT4 16 x 16k's +1.3% of call 1 (identical
# SASS and launches on that path) from the spread between binaries; no SDPA (call 1's stands).
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"
W=/tmp/w14b; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS
rm -rf /tmp/bin; mkdir -p /tmp/bin; tar xJf $S/bins.tar.xz -C /tmp/bin turbo_decode-base turbo_decode-new COMMIT || exit 1
B=/tmp/bin
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode2.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() { timeout 12 $B/$2 $SH --only default 2>&1 | sed "s/^/$1 /" | tee -a $W/decode2.txt; }
for rep in 1 2 3 4 5; do
  if [ $((rep % 2)) = 1 ]; then run_v base$rep turbo_decode-base; run_v new$rep turbo_decode-new
  else run_v new$rep turbo_decode-new; run_v base$rep turbo_decode-base; fi
  [ $((SECONDS - T0)) -gt 70 ] && break
done
echo "end $((SECONDS-T0)) s" | tee -a $W/decode2.txt; date -u | tee -a $W/decode2.txt
cp $W/decode2.txt $OUT/
