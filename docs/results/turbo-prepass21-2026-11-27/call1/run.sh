#!/bin/bash
# issue-11-prepass21, call 1: ncu (--set full) of main's and the branch's pre-passes (turbo_quant_kv_*, turbo_quant_q_*)
# at 4 x 4096; the fast prefill bench, main (base-bins21 e13f40a) and new interleaved three rounds, SDPA in the same
# call; the prefill tests, the device path's fast prefill, memcheck + racecheck on gpu_turbo_sanitizer_small.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b1.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p21
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } > $I
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in base new; do
  timeout 60 $NCU --clock-control none --set full -k regex:turbo_quant -c 2 -o $W/ncu_$v ./turbo_prefill_$v 4 4096 --causal no --only fast --inputs uniform > $W/ncu_${v}_log.txt 2>&1
  echo "$(ts) ncu $v rc=$?" >> $I
  $NCU -i $W/ncu_$v.ncu-rep --page details > $W/ncu_${v}_details.txt 2>&1
  timeout 30 $NCU --clock-control none -k regex:"turbo_(quant_q|quant_kv|prefill_wgf)" -c 3 --metrics gpu__time_duration.sum,dram__bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum ./turbo_prefill_$v 4 4096 --causal no --only fast --inputs uniform > $W/ncu_${v}_time.txt 2>&1
  echo "$(ts) ncu-time $v rc=$?" >> $I
done
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "base 1" "new 1" "new 2" "base 2" "base 3" "new 3"; do set -- $ob
  timeout 40 ./turbo_prefill_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 40 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
timeout 150 ./gpu_turbo_new prefill --include-ignored --test-threads=1 --nocapture > $W/t_prefill.txt 2>&1; echo "$(ts) prefill tests rc=$?" >> $I
grep -E "^test |test result" $W/t_prefill.txt >> $I
timeout 60 ./gpu_device_api_new gpu_turbo_fast_prefill_device_path_matches_the_host_path --include-ignored --test-threads=1 > $W/t_devapi.txt 2>&1; echo "$(ts) device path rc=$?: $(grep -m1 'test result' $W/t_devapi.txt)" >> $I
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo_new gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt) $(grep -m1 'test result' $W/san_$tool.txt)" >> $I; done
date -u >> $I; cd $W && tar czf $OUT/p21.tgz *; cat $I
