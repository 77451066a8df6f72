#!/bin/bash
# issue-11-prepass21, call 2: v2 (K and V of a block in two CTAs, 62 registers) against v1 (call 1's 894d71c) and main
# (base-bins21 e13f40a), three rounds interleaved, SDPA in the same call; ncu of v2's pre-passes; v2's prefill tests,
# the device path's fast prefill, memcheck + racecheck on gpu_turbo_sanitizer_small.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b2.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p21
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21b; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in v2 v1; do
  timeout 30 $NCU --clock-control none -k regex:"turbo_(quant_q|quant_kv|prefill_wgf)" -c 3 --metrics gpu__time_duration.sum,dram__bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum ./turbo_prefill_$v 4 4096 --causal no --only fast --inputs uniform > $W/ncu_${v}_time.txt 2>&1
  echo "$(ts) ncu-time $v rc=$?" >> $I
done
timeout 60 $NCU --clock-control none --set full -k regex:turbo_quant -c 2 -o $W/ncu_v2 ./turbo_prefill_v2 4 4096 --causal no --only fast --inputs uniform > $W/ncu_v2_log.txt 2>&1
echo "$(ts) ncu full v2 rc=$?" >> $I; $NCU -i $W/ncu_v2.ncu-rep --page details > $W/ncu_v2_details.txt 2>&1
cp ncu_base.ncu-rep $W/ncu_base1.ncu-rep; cp ncu_new.ncu-rep $W/ncu_v1.ncu-rep
for r in base1 v1 v2; do $NCU -i $W/ncu_$r.ncu-rep --page raw > $W/ncu_${r}_raw.txt 2>&1; done; rm -f $W/ncu_base1.ncu-rep $W/ncu_v1.ncu-rep
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "base 1" "v2 1" "v1 1" "v1 2" "v2 2" "base 2" "base 3" "v1 3" "v2 3"; do set -- $ob
  timeout 40 ./turbo_prefill_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "v2 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
timeout 150 ./gpu_turbo_v2 prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill.txt 2>&1; echo "$(ts) prefill tests rc=$?" >> $I
grep -E "^test .*(ok|FAILED)$|test result" $W/t_prefill.txt >> $I
timeout 60 ./gpu_device_api_v2 gpu_turbo_fast_prefill_device_path_matches_the_host_path --include-ignored --test-threads=1 > $W/t_devapi.txt 2>&1; echo "$(ts) device path rc=$?: $(grep -m1 'test result' $W/t_devapi.txt)" >> $I
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_v2 gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt) $(grep -m1 'test result' $W/san_$tool.txt)" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/p21b.tgz *; cat $I
grep -E "^  turbo_|gpu__time|dram__bytes.sum |warps_active" $W/ncu_*_time.txt | sed 's/^\/tmp\/o21b\///'
for v in base v1 v2; do for f in $W/bench_${v}_*; do echo "$(basename $f)"; grep -E "ms" $f | sed 's/turbo prefill //; s/ TFLOP.*//'; done; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
