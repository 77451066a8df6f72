#!/usr/bin/env bash
# issue 11 decode2, device call 3: tests + sanitizers on the final kernels, base / v1 / final decode timings, SDPA, ncu of the final g4 decode.
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"
W=/tmp/w; mkdir -p $W; cd $W
python3 -c "import tarfile; tarfile.open('$S/bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat COMMIT; } | tee $W/decode.txt
T0=$SECONDS
{ ./gpu_turbo --include-ignored --test-threads=6; ./gpu_device_api --include-ignored --test-threads=1 turbo; ./gpu_cp --include-ignored --test-threads=1 turbo; } > $W/tests.txt 2>&1
grep -E "^test result|FAILED|panicked|SKIPPED" $W/tests.txt | head -40
echo "tests $((SECONDS-T0)) s"
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >> $W/sanitizer.txt 2>&1
  echo "compute-sanitizer $tool rc=$?"
done
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $W/sanitizer.txt
SH="1 16384 1 32768 4 16384 64 4096 16 16384 8 32768 32 32768"
for v in base final v1 base final; do
  timeout 100 ./turbo_decode-$v $SH --only g4 2>&1 | sed "s/^/$v /" | tee -a $W/decode.txt
done
timeout 60 ./turbo_decode-final 16 16384 --only full 2>&1 | sed "s/^/final /" | tee -a $W/decode.txt
timeout 60 ./turbo_decode-base 16 16384 --only full 2>&1 | sed "s/^/base /" | tee -a $W/decode.txt
echo "timing $((SECONDS-T0)) s"
timeout 90 python3 $S/bench_sdpa.py $S/jobs.json $W/sdpa.json 2>&1 | tail -n 9 | tee -a $W/decode.txt
for bits in int4 mixed; do
timeout 40 ncu --clock-control none -k regex:turbo_decode_g4 -c 1 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --metrics smsp__inst_executed.sum -o $W/ncu16-$bits ./turbo_decode-final 16 16384 --bits $bits --only g4 --iters 1 > $W/ncu-$bits.log 2>&1
ncu -i $W/ncu16-$bits.ncu-rep --print-details all > $W/ncu16-$bits.txt 2>&1
grep -E "Duration|Executed Instructions  |Warp Cycles Per Issued|Eligible Warps Per Scheduler  |Stall Long|Stall Wait|Achieved Occupancy  |DRAM Throughput|SM Active Cycles|Elapsed Cycles" $W/ncu16-$bits.txt | head -12
done
echo "total $((SECONDS-T0)) s"
rm -f $W/gpu_* $W/turbo_decode-* $W/COMMIT $W/*.ncu-rep
cd /tmp && tar cJf $OUT/call3.tar.xz w && ls -la $OUT
