#!/usr/bin/env bash
# issue 11 decode9, call 2: main's decode kernels (the early 2-bit issue reverted); the stream-K
# cut weighted by the heads' bits in the turbo_decode bench's plans (plan_decode_for), swept
# through FERRATTN_TURBO_DECODE_WEIGHTS (0 = by count = main; default 11:9; 17:9 = bytes).
# Tests (gpu_turbo decode + NVRTC, the device API's turbo tests), sanitizers (small), timings
# interleaved with SDPA between them, per-SM active cycles (ncu) of count vs weighted cuts.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w9b; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-165}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin; tar xJf $S/bin.tar.xz -C /tmp || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d9b LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
timeout $(left 75 80) $B/gpu_turbo decode run_turbo nvrtc --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo nvrtc rc=$?" >> $W/tests.txt
timeout $(left 15 75) $B/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -hE "^test |^test result|FAILED|panicked|rc=" $W/tests.txt $W/device_api.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  L=$(left 25 60); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = label, $2 = binary, $3 = weights (- = unset), $4 = time limit, then args
  local v=$1 bin=$2 wt=$3 l=$4; shift 4; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  if [ "$wt" = - ]; then timeout $l $B/$bin "$@" --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
  else FERRATTN_TURBO_DECODE_WEIGHTS=$wt timeout $l $B/$bin "$@" --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt; fi
}
for rep in 1 2; do
  run_v base turbo_decode-base - $(left 14 40) $SH
  run_v new turbo_decode-new - $(left 14 36) $SH
  run_v new-w0 turbo_decode-new 0 $(left 14 32) $SH --bits mixed
  run_v new-w17:9 turbo_decode-new 17:9 $(left 14 30) $SH --bits mixed
  run_v new-w13:10 turbo_decode-new 13:10 $(left 14 28) $SH --bits mixed
  if [ $rep = 1 ]; then
    timeout $(left 25 24) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
    echo "sdpa $((SECONDS-T0)) s"
  fi
done
echo "timing $((SECONDS-T0)) s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for sh in "16 16384" "64 4096"; do
  for wt in 0 11:9; do
    L=$(left 12 0); [ $L -lt 5 ] && { echo "no time for ncu $sh $wt"; continue; }
    FERRATTN_TURBO_DECODE_WEIGHTS=$wt timeout $L $NCU --clock-control none -k regex:turbo_decode_g4_fast -c 1 --metrics sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_active.min,gpu__time_duration.sum,smsp__inst_executed.max,smsp__inst_executed.avg,smsp__inst_executed.min $B/turbo_decode-new $sh --bits mixed --only default --iters 1 > $W/ncu-${sh// /x}-w${wt/:/-}.txt 2>&1
    echo "ncu $sh w=$wt: $(grep -E 'sm__cycles_active|gpu__time|smsp__inst' $W/ncu-${sh// /x}-w${wt/:/-}.txt | awk '{print $1, $NF}' | tr '\n' ' ')"
  done
done
echo "end $((SECONDS-T0)) s"
cd /tmp && tar cJf $OUT/call2.tar.xz w9b; ls -la $OUT
