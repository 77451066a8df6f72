#!/usr/bin/env bash
# issue 11 decode13 (helper): the g4 fast decode with the tile's format tested as branches (folded tiles first),
# predicated parameter / scale copies and per-segment values out of the tile loop (new) against main 1eb66ef (base).
# Bench base/new interleaved three times (SDPA + copy ceiling after round 1; one base/new pair with the combine under
# PDL, FERRATTN_TURBO_COMBINE_PDL=1, after round 2), then gpu_turbo decode run_turbo --include-ignored, memcheck and
# racecheck on gpu_turbo_sanitizer_small (new binary), then the NVRTC test if time is left.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w13; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-115}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin; mkdir -p /tmp/bin; tar xJf $S/bins.tar.xz -C /tmp/bin || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d13 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = label, $2 = binary, $3 = time limit
  local v=$1 bin=$2 l=$3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l $B/$bin $SH --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
}
for rep in 1 2 3; do
  run_v base turbo_decode-base $(left 10 90)
  run_v new turbo_decode-new $(left 10 85)
  if [ $rep = 1 ]; then
    timeout $(left 25 75) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
    echo "sdpa $((SECONDS-T0)) s" | tee -a $W/decode.txt
  fi
  if [ $rep = 2 ]; then
    FERRATTN_TURBO_COMBINE_PDL=1 run_v base-pdl turbo_decode-base $(left 10 80)
    FERRATTN_TURBO_COMBINE_PDL=1 run_v new-pdl turbo_decode-new $(left 10 75)
  fi
done
echo "bench end $((SECONDS-T0)) s" | tee -a $W/decode.txt
timeout $(left 40 35) $B/gpu_turbo decode run_turbo --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo rc=$?" >> $W/tests.txt
grep -hE "^test |^test result|FAILED|panicked|rc=" $W/tests.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s" | tee -a $W/decode.txt
for tool in memcheck racecheck; do
  L=$(left 25 0)
  if [ $L -ge 5 ]; then
    FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san-$tool.txt 2>&1
    echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
    grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/san-$tool.txt | tee -a $W/sanitizer.txt
  else echo "no time for $tool" | tee -a $W/sanitizer.txt; fi
done
echo "sanitizers $((SECONDS-T0)) s" | tee -a $W/decode.txt
L=$(left 30 0)
if [ $L -ge 10 ]; then
  timeout $L $B/gpu_turbo nvrtc --include-ignored --test-threads=2 > $W/tests-nvrtc.txt 2>&1; echo "gpu_turbo nvrtc rc=$?" >> $W/tests-nvrtc.txt
  grep -hE "^test |^test result|rc=" $W/tests-nvrtc.txt
else echo "no time for nvrtc" | tee $W/tests-nvrtc.txt; fi
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt
cd /tmp && tar cJf $OUT/call1.tar.xz w13; ls -la $OUT
