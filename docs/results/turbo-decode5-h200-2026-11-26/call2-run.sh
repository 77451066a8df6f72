#!/usr/bin/env bash
# issue 11 decode5, call 2: the final tree (prefetch reverted: main's decode kernels, the fast
# decode the default on sm_90). Tests again on the final binaries, the Python TurboCache tests
# (call 1 imported another session's stale /tmp/site), sanitizers, timings (default vs main's
# g4fast), a stream-K unit sweep and an Nsight Compute look at 64 x 4k mixed.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w2; rm -rf $W; mkdir -p $W; cd $W
T0=$SECONDS; END=${END:-125}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
python3 -c "import tarfile; tarfile.open('$S/bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d5 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat bin/COMMIT; } | tee $W/decode.txt
rm -rf /tmp/site-d5 /tmp/wheels-d5; mkdir -p /tmp/wheels-d5 && tar xf $S/wheels.tar -C /tmp/wheels-d5
pip install -q --no-index --no-deps --upgrade --target /tmp/site-d5 /tmp/wheels-d5/wheels/*.whl > $W/pytest.txt 2>&1
PYTHONPATH=/tmp/site-d5 python3 -c "import ferrattn, inspect; print(ferrattn.__file__); print(inspect.signature(ferrattn.TurboCache.__init__))" >> $W/pytest.txt 2>&1
PYTHONPATH=/tmp/site-d5 timeout $(left 40 90) python3 -m pytest -q "$S/tests/test_gpu.py" -k "turbo_cache" -p no:cacheprovider >> $W/pytest.txt 2>&1; echo "pytest rc=$?" >> $W/pytest.txt
tail -n 4 $W/pytest.txt; echo "python $((SECONDS-T0)) s"
timeout $(left 45 50) ./bin/gpu_turbo --include-ignored --test-threads=4 --nocapture > $W/tests.txt 2>&1; echo "gpu_turbo rc=$?" >> $W/tests.txt
timeout $(left 15 45) ./bin/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 --nocapture > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -hE "^test result|FAILED|panicked|rc=" $W/tests.txt $W/device_api.txt | head -20
echo "rust tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  L=$(left 15 35); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 ./bin/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $W/sanitizer.txt; echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() { local v=$1 o=$2 l=$3; shift 3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l ./bin/turbo_decode-$v "$@" --only $o 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt; }
run_v base g4fast $(left 12 28) $SH; run_v new default $(left 12 16) $SH
timeout $(left 9 7) python3 "$R/scripts/bench_sdpa.py" $S/jobs.json $W/sdpa.json 2>&1 | tail -n 6 | tee -a $W/decode.txt
run_v new g4fast $(left 6 0) 64 4096 16 16384 --bits mixed --units auto,1188,792
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
L=$(left 15 0); [ $L -ge 5 ] && timeout $L $NCU --section SpeedOfLight --section Occupancy --section LaunchStats -k regex:"turbo_(decode|combine)" -c 4 ./bin/turbo_decode-new 64 4096 --bits mixed --only g4fast --iters 1 > $W/ncu.txt 2>&1
grep -E "turbo_|Duration|Compute \(SM\) Throughput|DRAM Throughput|Memory Throughput|Achieved Occupancy" $W/ncu.txt | head -30
echo "total $((SECONDS-T0)) s"
cd /tmp && rm -rf w2/bin && tar cJf $OUT/call2.tar.xz w2 && ls -la $OUT
