#!/usr/bin/env bash
# issue 11 decode12: the INT8 buffer tile's products as non-inlined routines (new) against main's
# decode (base: the bench binary of 9fcc508, whose decode kernels and host decode code are main's).
# Bench first (base/new interleaved twice, SDPA + copy ceiling after round 1), then gpu_turbo decode
# run_turbo --include-ignored, then compute-sanitizer memcheck on gpu_turbo_sanitizer_small.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w12; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-88}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin; tar xJf $S/bin.tar.xz -C /tmp || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d12 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = label, $2 = binary, $3 = time limit
  local v=$1 bin=$2 l=$3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l $B/$bin $SH --only default 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
}
for rep in 1 2; do
  run_v base turbo_decode-base $(left 10 60)
  run_v new turbo_decode-new $(left 10 55)
  if [ $rep = 1 ]; then
    timeout $(left 18 50) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
    echo "sdpa $((SECONDS-T0)) s" | tee -a $W/decode.txt
  fi
done
echo "bench end $((SECONDS-T0)) s" | tee -a $W/decode.txt
timeout $(left 45 10) $B/gpu_turbo decode run_turbo --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo rc=$?" >> $W/tests.txt
grep -hE "^test |^test result|FAILED|panicked|rc=" $W/tests.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s" | tee -a $W/decode.txt
L=$(left 20 0)
if [ $L -ge 5 ]; then
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer memcheck rc=$?" | tee -a $W/sanitizer.txt
else echo "no time for memcheck"; fi
grep -E "ERROR SUMMARY|test result" $W/sanitizer.txt
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt
cd /tmp && tar cJf $OUT/call1.tar.xz w12; ls -la $OUT
