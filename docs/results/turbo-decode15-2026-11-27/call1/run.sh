#!/usr/bin/env bash
# issue 11 decode15 (helper): the INT8 buffer tile's q K^T and P V out of line (__noinline__) in the mixed instance
# (turbo_decode_g4_fast_mixed_*) only, against decode14's measured turbo_decode (8b56b83 = main 2a9bc56's decode kernels).
# Tests (gpu_turbo decode), memcheck + racecheck on gpu_turbo_sanitizer_small (new binary), then turbo_decode --only default
# base/new interleaved five rounds with the order swapped every round, SDPA + copy ceiling after round 1, the new binary's
# two mixed-capable kernels forced (g4fastswitch = main's code, g4fastbranches = the new instance), then Nsight Compute
# of the new default at 64 x 4k mixed (decode14's sections, for the no_inst share).
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w15; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-140}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin15; mkdir -p /tmp/bin15; tar xJf $S/bins.tar.xz -C /tmp/bin15 || exit 1
B=/tmp/bin15
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d15 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
timeout $(left 45 100) $B/gpu_turbo decode --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode rc=$?" >> $W/tests.txt
grep -hE "^test |^test result|FAILED|panicked|rc=" $W/tests.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s" | tee -a $W/decode.txt
for tool in memcheck racecheck; do
  L=$(left 25 80); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san-$tool.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/san-$tool.txt | tee -a $W/sanitizer.txt
done
echo "sanitizer $((SECONDS-T0)) s" | tee -a $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() { local l=$(left 12 $3); [ $l -lt 3 ] && { echo "no time for $1"; return; }; timeout $l $B/$2 $SH --only default 2>&1 | sed "s/^/$1 /" | tee -a $W/decode.txt; }
for rep in 1 2 3 4 5; do
  if [ $((rep % 2)) = 1 ]; then run_v base$rep turbo_decode-base 40; run_v new$rep turbo_decode-new 36
  else run_v new$rep turbo_decode-new 40; run_v base$rep turbo_decode-base 36; fi
  if [ $rep = 1 ]; then timeout $(left 30 45) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt; fi
done
echo "bench end $((SECONDS-T0)) s" | tee -a $W/decode.txt
L=$(left 12 20); [ $L -ge 3 ] && timeout $L $B/turbo_decode-new 16 16384 8 32768 64 4096 --bits mixed --only g4fastswitch,g4fastbranches 2>&1 | sed "s/^/ab /" | tee -a $W/decode.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
L=$(left 25 0)
if [ $L -ge 8 ]; then
  timeout $L $NCU --clock-control none -k regex:"turbo_(decode_g4_fast|combine)" -c 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SourceCounters --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,smsp__inst_executed.sum,gpu__time_duration.sum -o $W/ncu-64x4k -f $B/turbo_decode-new 64 4096 --bits mixed --only default --iters 1 > $W/ncu-64x4k.log 2>&1
  echo "ncu rc=$? $((SECONDS-T0)) s"
  $NCU -i $W/ncu-64x4k.ncu-rep --page details > $W/ncu-64x4k.txt 2>&1
  $NCU -i $W/ncu-64x4k.ncu-rep --page source --csv --print-source sass > $W/ncu-64x4k-sass.csv 2>&1; xz -9 $W/ncu-64x4k-sass.csv
  grep -E "turbo_|Duration|Issue Slots Busy|No Eligible|Executed Instructions  |sm__cycles_active|smsp__inst_executed" $W/ncu-64x4k.txt | head -24
else echo "no time for ncu"; fi
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt; date -u | tee -a $W/decode.txt
cp $W/decode.txt $W/tests.txt $W/sanitizer.txt $W/sdpa.json $W/ncu-64x4k.txt $W/ncu-64x4k-sass.csv.xz $OUT/ 2>/dev/null; ls -la $OUT
