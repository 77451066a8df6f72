#!/usr/bin/env bash
# issue 11 decode14 (helper): turbo_decode_g4_fast_mixed_* (decode13's branch-dispatch body as its own instance, chosen by
# turbo::decode_branches_policy: a 2-bit head and a grid that fills the GPU) against main a005076. Tests (gpu_turbo decode),
# memcheck + racecheck on gpu_turbo_sanitizer_small (new binary), then turbo_decode --only default base/new interleaved three
# rounds with SDPA + copy ceiling after round 1, the two kernels in one binary (g4fastswitch/g4fastbranches), a units sweep,
# then Nsight Compute of the new default at 64 x 4k and 16 x 16k mixed (decode + combine).
set -uo pipefail
S="$(cd "$(dirname "$0")" && pwd)"; R="$(pwd)"
W=/tmp/w14; rm -rf $W; mkdir -p $W; cd /tmp
T0=$SECONDS; END=${END:-170}
left() { local l=$((END - (SECONDS - T0) - ${2:-0})); [ $l -gt $1 ] && l=$1; echo $l; }
rm -rf /tmp/bin; mkdir -p /tmp/bin; tar xJf $S/bins.tar.xz -C /tmp/bin || exit 1
B=/tmp/bin
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-d14 LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; cat $B/COMMIT; } | tee $W/decode.txt
timeout $(left 45 120) $B/gpu_turbo decode --include-ignored --test-threads=4 > $W/tests.txt 2>&1; echo "gpu_turbo decode rc=$?" >> $W/tests.txt
grep -hE "^test |^test result|FAILED|panicked|rc=|branches_equal" $W/tests.txt | grep -v "\.\.\. ok$" | head -30
echo "tests $((SECONDS-T0)) s" | tee -a $W/decode.txt
for tool in memcheck racecheck; do
  L=$(left 25 95); [ $L -lt 5 ] && { echo "no time for $tool"; continue; }
  FERRATTN_GPU_TEST_SCALE=small timeout $L compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san-$tool.txt 2>&1
  echo "compute-sanitizer $tool rc=$?" | tee -a $W/sanitizer.txt; grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|test result" $W/san-$tool.txt | tee -a $W/sanitizer.txt
done
echo "sanitizer $((SECONDS-T0)) s" | tee -a $W/decode.txt
SH="1 16384 16 16384 8 32768 64 4096 32 32768"
run_v() { local l=$(left 12 $3); [ $l -lt 3 ] && { echo "no time for $1"; return; }; timeout $l $B/$2 $SH --only default 2>&1 | sed "s/^/$1 /" | tee -a $W/decode.txt; }
for rep in 1 2 3; do
  run_v base$rep turbo_decode-base 45; run_v new$rep turbo_decode-new 40
  if [ $rep = 1 ]; then timeout $(left 30 50) python3 "$R/scripts/bench_sdpa.py" $S/jobs-decode.json $W/sdpa.json 2>&1 | tail -n 7 | tee -a $W/decode.txt; fi
done
echo "bench end $((SECONDS-T0)) s" | tee -a $W/decode.txt
L=$(left 15 35); [ $L -ge 3 ] && timeout $L $B/turbo_decode-new 16 16384 8 32768 64 4096 --bits mixed --only g4fastswitch,g4fastbranches 2>&1 | sed "s/^/ab /" | tee -a $W/decode.txt
L=$(left 12 30); [ $L -ge 3 ] && timeout $L $B/turbo_decode-new 64 4096 16 16384 --bits mixed --only default --units auto,1056,1320,1536,2112,3168 2>&1 | sed "s/^/units /" | tee -a $W/decode.txt
echo "ab/units end $((SECONDS-T0)) s" | tee -a $W/decode.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof() {  # $1 = label, $2 = time limit, then shape
  local v=$1 l=$2; shift 2; [ $l -lt 8 ] && { echo "no time for ncu $v"; return; }
  timeout $l $NCU --clock-control none -k regex:"turbo_(decode_g4_fast|combine)" -c 2 --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats --section SourceCounters --metrics sm__cycles_active.min,sm__cycles_active.max,sm__cycles_active.avg,smsp__inst_executed.min,smsp__inst_executed.max,smsp__inst_executed.avg,smsp__inst_executed.sum,gpu__time_duration.sum -o $W/ncu-$v -f $B/turbo_decode-new "$@" --bits mixed --only default --iters 1 > $W/ncu-$v.log 2>&1
  echo "ncu $v rc=$? $((SECONDS-T0)) s"
  $NCU -i $W/ncu-$v.ncu-rep --page details > $W/ncu-$v.txt 2>&1
  $NCU -i $W/ncu-$v.ncu-rep --page source --csv --print-source sass > $W/ncu-$v-sass.csv 2>&1
  xz -9 $W/ncu-$v-sass.csv
  grep -E "turbo_|Duration|DRAM Throughput|Issue Slots Busy|Eligible Warps|No Eligible|Executed Instructions  |sm__cycles_active|smsp__inst_executed" $W/ncu-$v.txt | head -40
}
prof 64x4k $(left 30 12) 64 4096
prof 16x16k $(left 30 0) 16 16384
echo "end $((SECONDS-T0)) s" | tee -a $W/decode.txt; date -u | tee -a $W/decode.txt
cd /tmp && tar cJf $OUT/call1.tar.xz --exclude="*.ncu-rep" w14; cp $W/decode.txt $W/tests.txt $W/sanitizer.txt $OUT/ 2>/dev/null; ls -la $OUT
