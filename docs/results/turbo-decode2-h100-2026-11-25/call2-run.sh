#!/usr/bin/env bash
# issue 11 decode2, device call 2: tests + sanitizers on the new kernels, old/new decode timings, SDPA, ncu of the new g4 decode.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"
W=/tmp/w; mkdir -p $W; cd $W
python3 -c "import tarfile; tarfile.open('$S/bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat COMMIT; } | tee $W/decode.txt
T0=$SECONDS
{ ./gpu_turbo --include-ignored --test-threads=4; ./gpu_device_api --include-ignored --test-threads=1 turbo; ./gpu_cp --include-ignored --test-threads=1 turbo; } > $W/tests.txt 2>&1
grep -E "^test result|FAILED|panicked|SKIPPED|differing O" $W/tests.txt | head -40
echo "tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?"
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $W/sanitizer.txt
echo "sanitizer $((SECONDS-T0)) s"
SH="1 16384 1 32768 4 16384 64 4096 16 16384 8 32768 32 32768"
for v in base new base new; do
  timeout 100 ./turbo_decode-$v $SH --only g4 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
done
echo "timing $((SECONDS-T0)) s"
timeout 90 python3 $S/bench_sdpa.py $S/jobs.json $W/sdpa.json 2>&1 | tail -n 9 | tee -a $W/decode.txt
FERRATTN_NVRTC_DEFINES="-DFERRATTN_TURBO_DECODE_G4_BLOCKS=4" timeout 60 ./turbo_decode-new 16 16384 1 16384 --only g4 --nvrtc 2>&1 | sed "s/^/new-g4x4 /" | tee -a $W/decode.txt
timeout 60 ncu --clock-control none -k regex:turbo_decode_g4 -c 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SourceCounters --metrics smsp__inst_executed.sum -o $W/ncu16-int4 ./turbo_decode-new 16 16384 --bits int4 --only g4 --iters 1 > $W/ncu.log 2>&1
ncu -i $W/ncu16-int4.ncu-rep --print-details all > $W/ncu16-int4.txt 2>&1
ncu -i $W/ncu16-int4.ncu-rep --page source --csv --print-source sass > $W/ncu16-int4-sass.csv 2>&1
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Eligible Warps Per Scheduler  |Registers Per Thread  |Achieved Occupancy|DRAM Throughput|SM Active Cycles|Elapsed Cycles" $W/ncu16-int4.txt | head -12
echo "total $((SECONDS-T0)) s"
rm -f $W/gpu_* $W/turbo_decode-* $W/COMMIT
cd /tmp && tar cJf $OUT/call2.tar.xz w && ls -la $OUT
