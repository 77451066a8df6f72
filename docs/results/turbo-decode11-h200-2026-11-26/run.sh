#!/usr/bin/env bash
# issue 11 decode11: the per-segment query quantization (Markstein's exact quotient, split between
# the lane pairs of the half-row instance) against main's decode kernels. Tests (gpu_turbo decode
# + NVRTC, the device API's turbo tests), sanitizers (small), then turbo_decode --only default of
# base and new interleaved twice, SDPA after the first round, then ncu of 64 x 4k mixed (both).
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w11; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-140}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin; tar xJf $S/bin.tar.xz -C /tmp || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d11 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
timeout $(left 75 65) $B/gpu_turbo decode run_turbo nvrtc --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo nvrtc rc=$?" >> $W/tests.txt
timeout $(left 12 63) $B/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -hE "^test |^test result|FAILED|panicked|rc=" $W/tests.txt $W/device_api.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s" | tee -a $W/decode.txt
for tool in memcheck racecheck; do
  L=$(left 20 52); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s" | tee -a $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = label, $2 = binary, $3 = time limit
  local v=$1 bin=$2 l=$3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l $B/$bin $SH --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
}
for rep in 1 2; do
  run_v base turbo_decode-base $(left 12 40)
  run_v new turbo_decode-new $(left 12 28)
  if [ $rep = 1 ]; then
    timeout $(left 22 28) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
    echo "sdpa $((SECONDS-T0)) s" | tee -a $W/decode.txt
  fi
done
echo "bench end $((SECONDS-T0)) s" | tee -a $W/decode.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof() {  # $1 = label, $2 = binary, $3 = time limit, then shape
  local v=$1 bin=$2 l=$3; shift 3; [ $l -lt 8 ] && { echo "no time for ncu $v"; return; }
  timeout $l $NCU --clock-control none -k regex:turbo_decode_g4_fast -c 1 --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section SourceCounters -o $W/ncu-$v -f $B/$bin "$@" --bits mixed --only default --iters 1 > $W/ncu-$v.log 2>&1
  echo "ncu $v rc=$? $((SECONDS-T0)) s"
  $NCU -i $W/ncu-$v.ncu-rep --page details > $W/ncu-$v.txt 2>&1
  $NCU -i $W/ncu-$v.ncu-rep --page source --csv --print-source sass > $W/ncu-$v-sass.csv 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|No Eligible|Executed Instructions  " $W/ncu-$v.txt | head -8
}
prof base-64x4k turbo_decode-base $(left 25 14) 64 4096
prof new-64x4k turbo_decode-new $(left 25 0) 64 4096
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt
cd /tmp && tar cJf $OUT/call1.tar.xz --exclude="*.ncu-rep" w11; ls -la $OUT
