#!/usr/bin/env bash
# issue 11 decode8: call 1 timed the decode's two-stage cp.async ring with the combine under a
# programmatic dependent launch; call 2 the PDL alone (the ring reverted). Tests (gpu_turbo decode + NVRTC, the device API's turbo test), sanitizers
# (small), then base / new / new without PDL decode timings interleaved, SDPA in the same call.
# One overall deadline (END seconds) so that the call ends inside its limit.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=$OUT; cd /tmp
T0=$SECONDS; END=${END:-140}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
tar xJf $S/bin.tar.xz -C /tmp || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
echo "unpacked $((SECONDS-T0)) s"
timeout $(left 50 85) $B/gpu_turbo decode run_turbo nvrtc --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo nvrtc rc=$?" >> $W/tests.txt
timeout $(left 15 80) $B/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -E "^test |^test result|FAILED|panicked|rc=" $W/tests.txt $W/device_api.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  L=$(left 25 65); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = label, $2 = binary, $3 = time limit, then shapes; env passed through
  local v=$1 bin=$2 l=$3; shift 3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l $B/$bin "$@" --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
}
run_v base turbo_decode-base $(left 14 45) $SH
run_v new turbo_decode-new $(left 14 38) $SH
FERRATTN_TURBO_COMBINE_PDL=0 run_v new-nopdl turbo_decode-new $(left 14 31) $SH
echo "timing1 $((SECONDS-T0)) s"
timeout $(left 25 8) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
echo "sdpa $((SECONDS-T0)) s"
run_v base turbo_decode-base $(left 14 0) $SH
run_v new turbo_decode-new $(left 14 0) $SH
run_v base turbo_decode-base $(left 14 0) $SH
run_v new turbo_decode-new $(left 14 0) $SH
echo "end $((SECONDS-T0)) s"
