#!/usr/bin/env bash
# issue 11 decode4: tests + sanitizers on the new kernels (fast-contract instances, high-nibble
# rows), base/new decode timings interleaved, SDPA in the same call.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"
W=/tmp/w; mkdir -p $W; cd $W
python3 -c "import tarfile; tarfile.open('$S/bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat bin/COMMIT; } | tee $W/decode.txt
T0=$SECONDS
timeout 80 ./bin/gpu_turbo --include-ignored --test-threads=4 --nocapture > $W/tests.txt 2>&1; echo "gpu_turbo rc=$?" >> $W/tests.txt
grep -E "^test result|FAILED|panicked|SKIPPED|rc=|fast contract over|vs golden over all steps|^\| " $W/tests.txt | head -60
echo "tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  L=$((120 - (SECONDS-T0))); [ $L -gt 40 ] && L=40; [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 ./bin/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = base|new, $2 = time limit
  if [ $1 = base ]; then O=g4; else O=g4,g4fast; fi
  timeout $2 ./bin/turbo_decode-$1 $SH --only $O 2>&1 | sed "s/^/$1 /" | tee -a $W/decode.txt
}
run_v base 25; run_v new 45
echo "timing1 $((SECONDS-T0)) s"
timeout 40 python3 $S/bench_sdpa.py $S/jobs.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
echo "sdpa $((SECONDS-T0)) s"
L=$((230 - (SECONDS-T0))); [ $L -gt 25 ] && L=25; [ $L -ge 5 ] && run_v base $L
L=$((262 - (SECONDS-T0))); [ $L -gt 45 ] && L=45; [ $L -ge 5 ] && run_v new $L
echo "timing2 $((SECONDS-T0)) s"
echo "total $((SECONDS-T0)) s"
cd /tmp && rm -rf w/bin && tar cJf $OUT/call.tar.xz w && ls -la $OUT
