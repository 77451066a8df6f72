#!/usr/bin/env bash
# issue 11 decode13, call 4: the branch tip (main's decode kernels + the combine's PDL policy: on with a 2-bit head or a grid
# under one CTA a SM, off otherwise) against main 1eb66ef, interleaved three rounds, SDPA + copy ceiling after round 1;
# then gpu_turbo decode run_turbo --include-ignored and memcheck on gpu_turbo_sanitizer_small (the tip's binary).
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w13d; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS
rm -rf /tmp/bin; mkdir -p /tmp/bin; tar xJf $S/bins4.tar.xz -C /tmp/bin || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d13 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() { timeout 10 $B/$2 $SH --only default 2>&1 | sed "s/^/$1 /" | tee -a $W/decode.txt; }
for rep in 1 2 3; do
  run_v base turbo_decode-base; run_v tip turbo_decode-new
  if [ $rep = 1 ]; then timeout 30 python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt; fi
done
echo "bench end $((SECONDS-T0)) s" | tee -a $W/decode.txt
timeout 30 $B/gpu_turbo decode run_turbo --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode run_turbo rc=$?" >> $W/tests.txt
grep -hE "^test result|FAILED|panicked|rc=" $W/tests.txt
FERRATTN_GPU_TEST_SCALE=small timeout 20 compute-sanitizer --tool memcheck --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san-memcheck.txt 2>&1
echo "compute-sanitizer memcheck rc=$?" | tee -a $W/sanitizer.txt; grep -hE "ERROR SUMMARY|test result" $W/san-memcheck.txt | tee -a $W/sanitizer.txt
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt; date -u | tee -a $W/decode.txt
cd /tmp && tar cJf $OUT/call4.tar.xz w13d
