#!/usr/bin/env bash
# issue 11 decode13, call 2: more samples of the same binaries as call 1 (no rebuild): base / new, each with the
# combine launched plainly and under PDL (FERRATTN_TURBO_COMBINE_PDL=1), interleaved three rounds; copy ceiling again.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w13b; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS
rm -rf /tmp/bin; mkdir -p /tmp/bin; tar xJf $S/bins.tar.xz -C /tmp/bin turbo_decode-new turbo_decode-base COMMIT || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d13 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() { timeout 10 $B/$2 $SH --only default 2>&1 | sed "s/^/$1 /" | tee -a $W/decode.txt; }
for rep in 1 2 3; do
  run_v base turbo_decode-base; run_v new turbo_decode-new
  FERRATTN_TURBO_COMBINE_PDL=1 run_v base-pdl turbo_decode-base; FERRATTN_TURBO_COMBINE_PDL=1 run_v new-pdl turbo_decode-new
done
timeout 40 python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt; date -u | tee -a $W/decode.txt
cd /tmp && tar cJf $OUT/call2.tar.xz w13b
