#!/usr/bin/env bash
# issue 11 decode5: the fast decode as the default on sm_90 (exact_turbo_decode for the bit-exact
# kernels) and the INT8 buffer tile prefetched into L2 a tile ahead. Tests (gpu_turbo, the device
# API's turbo test, the Python TurboCache tests), sanitizers, then base/new decode timings
# interleaved with SDPA in the same call. One overall deadline so that the call ends in time.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w; mkdir -p $W; cd $W
T0=$SECONDS; END=${END:-200}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
python3 -c "import tarfile; tarfile.open('$S/bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat bin/COMMIT; } | tee $W/decode.txt
timeout $(left 60 120) ./bin/gpu_turbo --include-ignored --test-threads=4 --nocapture > $W/tests.txt 2>&1; echo "gpu_turbo rc=$?" >> $W/tests.txt
timeout $(left 20 100) ./bin/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 --nocapture > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -E "^test |^test result|FAILED|panicked|SKIPPED|rc=|fast contract over|vs golden over all steps" $W/tests.txt $W/device_api.txt | grep -v "\.\.\. ok$" | head -40
echo "rust tests $((SECONDS-T0)) s"
if [ -f $S/wheels.tar ]; then
  mkdir -p /tmp/site && tar xf $S/wheels.tar -C /tmp && pip install -q --no-index --no-deps --target /tmp/site /tmp/wheels/*.whl > $W/pytest.txt 2>&1
  PYTHONPATH=/tmp/site timeout $(left 40 80) python3 -m pytest -q "$S/tests/test_gpu.py" -k "turbo_cache" -p no:cacheprovider >> $W/pytest.txt 2>&1; echo "pytest rc=$?" >> $W/pytest.txt
  tail -n 5 $W/pytest.txt
fi
echo "python $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  L=$(left 40 45); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 ./bin/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() {  # $1 = base|new, $2 = --only, $3 = time limit, $4.. = shapes
  local v=$1 o=$2 l=$3; shift 3; [ $l -lt 3 ] && { echo "no time for $v"; return; }
  timeout $l ./bin/turbo_decode-$v "$@" --only $o 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
}
run_v base g4fast $(left 14 45) $SH; run_v new g4fast,default $(left 20 45) $SH
echo "timing1 $((SECONDS-T0)) s"
timeout $(left 30 15) python3 "$R/scripts/bench_sdpa.py" $S/jobs.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt
echo "sdpa $((SECONDS-T0)) s"
run_v base g4fast,g4 $(left 12 2) 64 4096; run_v new g4fast,g4 $(left 12 0) 64 4096
run_v base g4fast $(left 8 0) 64 4096 16 16384; run_v new g4fast $(left 8 0) 64 4096 16 16384
echo "timing2 $((SECONDS-T0)) s"
echo "total $((SECONDS-T0)) s"
cd /tmp && rm -rf w/bin && tar cJf $OUT/call.tar.xz w && ls -la $OUT
