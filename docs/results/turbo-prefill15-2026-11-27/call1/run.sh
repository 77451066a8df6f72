#!/bin/bash
# issue-11-prefill15 (helper): adb9bea "split" (P V passes as two commit groups, oi[0] shifted under the pass into
# oi[1]) against main's kernel (bench_main = 49e595d's bench, the one-SHF shift that main 161be09 carries), SDPA in
# the same call; memcheck + racecheck on the prefill sanitizer test; ncu (WarpStateStats + SourceCounters) of one
# 4 x 4096 wgf launch of main and of round 14's no-shift build (timing only, wrong numbers); the twin test.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p15
mkdir -p $FERRATTN_CACHE_DIR; W=$OUT/o15; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
I=$W/info.txt
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; date -u +%FT%TZ; echo "adb9bea split; bench_main: 49e595d (= main 161be09's kernel); noshift: round 14 db32a65 -DFERRATTN_WGF_NO_SHIFT=1"; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
b() { timeout 40 ./bench_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "bench $1 $2 rc=$? t=$(el)" >> $I; }
b main 1; b split 1
timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "sdpa rc=$? t=$(el)" >> $I
b split 2; b main 2
for tool in memcheck racecheck; do
  timeout 30 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_split gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt) t=$(el)" >> $I
done
timeout 60 ./gpu_turbo_split gpu_turbo_fast_prefill_matches_its_twin --exact --include-ignored --test-threads=1 --nocapture > $W/t_twin.txt 2>&1; echo "twin rc=$? t=$(el)" >> $I
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
prof() {
  timeout 25 $NCU --clock-control none -k regex:turbo_prefill_wgf -c 1 --section WarpStateStats --section SourceCounters --section SchedulerStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.avg -o /tmp/ncu-$1 -f ./bench_$1 4 4096 --causal no --only fast --inputs uniform > $W/ncu-$1.log 2>&1
  echo "ncu $1 rc=$? t=$(el)" >> $I
  $NCU -i /tmp/ncu-$1.ncu-rep --page details > $W/ncu-$1.txt 2>&1
  $NCU -i /tmp/ncu-$1.ncu-rep --page source --csv --print-source sass > $W/ncu-$1-sass.csv 2>&1; xz -9 $W/ncu-$1-sass.csv
}
prof main; prof noshift
date -u +%FT%TZ >> $I
cat $I; for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
grep -h "test result\|FAILED\|panicked" $W/t_twin.txt; python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
grep -E "Duration|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per" $W/ncu-*.txt | head -40
