#!/usr/bin/env bash
# issue 11 decode9, call 1: 2-bit tiles staged in two slots, the next tile's halves issued early.
# Tests (gpu_turbo decode + NVRTC, the device API's turbo tests), sanitizers (small), base / new
# decode timings interleaved with SDPA between them, then Nsight Compute (source counters,
# --clock-control none) of base and new at 16 x 16k and 64 x 4k mixed.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w9; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-170}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin; tar xJf $S/bin.tar.xz -C /tmp || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d9 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
echo "unpacked $((SECONDS-T0)) s"
timeout $(left 60 115) $B/gpu_turbo decode run_turbo nvrtc --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo nvrtc rc=$?" >> $W/tests.txt
timeout $(left 15 105) $B/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -hE "^test |^test result|FAILED|panicked|rc=" $W/tests.txt $W/device_api.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  L=$(left 25 85); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = label, $2 = binary, $3 = time limit, then shapes
  local v=$1 bin=$2 l=$3; shift 3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l $B/$bin "$@" --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
}
run_v base turbo_decode-base $(left 14 60) $SH
run_v new turbo_decode-new $(left 14 52) $SH
timeout $(left 25 44) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
echo "sdpa $((SECONDS-T0)) s"
run_v base turbo_decode-base $(left 14 36) $SH
run_v new turbo_decode-new $(left 14 28) $SH
echo "timing $((SECONDS-T0)) s"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof() {  # $1 = label, $2 = binary, $3 = time limit, then shape
  local v=$1 bin=$2 l=$3; shift 3; [ $l -lt 5 ] && { echo "no time for ncu $v"; return; }
  timeout $l $NCU --clock-control none -k regex:turbo_decode_g4_fast -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SourceCounters -o $W/ncu-$v -f $B/$bin "$@" --bits mixed --only default --iters 1 > $W/ncu-$v.log 2>&1
  echo "ncu $v rc=$? $((SECONDS-T0)) s"
  $NCU -i $W/ncu-$v.ncu-rep --page details > $W/ncu-$v.txt 2>&1
  $NCU -i $W/ncu-$v.ncu-rep --page source --csv --print-source sass > $W/ncu-$v-sass.csv 2>&1
  grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Issue Slots Busy|Eligible Warps|L1/TEX Hit|L2 Hit|No Eligible" $W/ncu-$v.txt | head -12
}
prof base-16x16k turbo_decode-base $(left 25 50) 16 16384
prof new-16x16k turbo_decode-new $(left 25 25) 16 16384
prof base-64x4k turbo_decode-base $(left 25 0) 64 4096
prof new-64x4k turbo_decode-new $(left 25 0) 64 4096
echo "end $((SECONDS-T0)) s"
cd /tmp && tar cJf $OUT/call.tar.xz --exclude="*.ncu-rep" w9; tar cJf $OUT/reps.tar.xz w9/*.ncu-rep; ls -la $OUT
