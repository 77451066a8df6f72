#!/usr/bin/env bash
# issue 11 decode5, call 4: the combine as one warp per row (turbo_combine_*: 32-thread CTAs,
# no barrier after the LUT). Tests (the stream-K tests hold the combine to the CPU twin bit for
# bit), Python, sanitizers, main's g4fast vs the branch's default at three shapes with SDPA.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w4; rm -rf $W; mkdir -p $W; cd $W
T0=$SECONDS; END=${END:-44}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
python3 -c "import tarfile; tarfile.open('$S/bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d5 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat bin/COMMIT; } | tee $W/decode.txt
timeout $(left 24 20) ./bin/gpu_turbo --include-ignored --test-threads=6 --nocapture > $W/tests.txt 2>&1; echo "gpu_turbo rc=$?" >> $W/tests.txt
timeout $(left 3 16) ./bin/gpu_device_api gpu_turbo_ --include-ignored --test-threads=1 --nocapture > $W/device_api.txt 2>&1; echo "gpu_device_api rc=$?" >> $W/device_api.txt
grep -hE "^test result|FAILED|panicked|rc=" $W/tests.txt $W/device_api.txt | head -20
rm -rf /tmp/site-d5 /tmp/wheels-d5; mkdir -p /tmp/wheels-d5 && tar xf $S/wheels.tar -C /tmp/wheels-d5
pip install -q --no-index --no-deps --upgrade --target /tmp/site-d5 /tmp/wheels-d5/wheels/*.whl > $W/pytest.txt 2>&1
PYTHONPATH=/tmp/site-d5 timeout $(left 6 9) python3 -m pytest -q "$S/tests/test_gpu.py" -k "turbo_cache" -p no:cacheprovider >> $W/pytest.txt 2>&1; echo "pytest rc=$?" >> $W/pytest.txt
tail -n 2 $W/pytest.txt
for tool in memcheck racecheck; do
  L=$(left 3 5); [ $L -lt 2 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 ./bin/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $W/sanitizer.txt; echo "checks $((SECONDS-T0)) s"
run_v() { local v=$1 o=$2 l=$3; shift 3; [ $l -lt 2 ] && { echo "no time for $v"; return; }
  timeout $l ./bin/turbo_decode-$v "$@" --only $o 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt; }
run_v base g4fast $(left 4 6) 64 4096 16 16384 1 16384; run_v new default $(left 4 4) 64 4096 16 16384 1 16384
timeout $(left 4 0) python3 "$R/scripts/bench_sdpa.py" $S/jobs3.json $W/sdpa.json 2>&1 | tail -n 4 | tee -a $W/decode.txt
run_v new default $(left 3 0) 64 4096 1 16384; run_v base g4fast $(left 3 0) 64 4096 1 16384
echo "total $((SECONDS-T0)) s"
cd /tmp && rm -rf w4/bin && tar cJf $OUT/call4.tar.xz w4 && ls -la $OUT
