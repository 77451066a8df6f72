#!/bin/bash
# Helper, nineteenth session, issue-10-decode19, call 1: the profile of main's step at >= 1 GB (no branch code).
# ncu per launch (prepare, decode, merge; kernels serialized, caches flushed) at 16 x 16k and 32 x 32k for
# k4q-v3 and k2-v2; then graph timings of main's binary with the schedule's knobs (--units, --no-pdl, env
# switches) and two more shapes of the same bytes, to split the step's time into fixed and per-byte parts.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf bins.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; } | tee $OUT/env.txt
M="gpu__time_duration.sum,gpc__cycles_elapsed.max,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__waves_per_multiprocessor,sm__ctas_launched.max,sm__ctas_launched.min"
for r in long_scoreboard lg_throttle wait barrier math_pipe_throttle short_scoreboard no_instruction not_selected; do M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"; done
nc() { echo "== $*" >> $OUT/ncu.txt; timeout 45 ncu --clock-control none -k "regex:turboquant_(prepare|decode|combine)" -c 3 --metrics "$M" ./tq_main "$@" --iters 1 >> $OUT/ncu.txt 2>&1; echo "rc=$?" >> $OUT/ncu.txt; }
nc 16 16384 --config k4q-v3; ts ncu1 >> $OUT/env.txt
nc 16 16384 --config k2-v2; ts ncu2 >> $OUT/env.txt
nc 32 32768 --config k4q-v3; ts ncu3 >> $OUT/env.txt
nc 32 32768 --config k2-v2; ts ncu4 >> $OUT/env.txt
run() { echo "-- $*"; timeout 40 "$@" 2>&1 | grep -E "turboquant|error|panick"; }
e() { echo "-- env $1"; local v=$1; shift; env $v timeout 40 "$@" 2>&1 | grep -E "turboquant|error|panick"; }
C=k4q-v3,k2-v2
{ run ./tq_main 16 16384 --sets 2 --config $C
  run ./tq_main 16 16384 --sets 2 --config k4q-v3 --units 1536
  run ./tq_main 16 16384 --sets 2 --config k2-v2 --units 2048
  run ./tq_main 16 16384 --sets 2 --config $C --no-pdl
  e FERRATTN_TQ_MERGE_WARPS=16 ./tq_main 16 16384 --sets 2 --config $C
  e FERRATTN_TQ_UNIT_WARPS=6 ./tq_main 16 16384 --sets 2 --config $C
  run ./tq_main 16 32768 --sets 1 --config $C
  run ./tq_main 32 16384 --sets 1 --config $C
  run ./tq_main 32 32768 --sets 1 --config $C
  run ./tq_main 32 32768 --sets 1 --config k4q-v3 --units 1536
  run ./tq_main 32 32768 --sets 1 --config k2-v2 --units 2048
  run ./tq_main 32 32768 --sets 1 --config $C --no-pdl
  run ./tq_main 16 16384 --sets 2 --config $C
  run ./tq_main 32 32768 --sets 1 --config $C; } > $OUT/tq.txt 2>&1
ts bench done >> $OUT/env.txt
date -u >> $OUT/env.txt; cat $OUT/env.txt
grep -E "^== |^  turboquant_|gpu__time|sm__cycles_active|elapsed.max|warps_active|issue_active|dram__th|grid_size|waves|ctas_launched|rc=" $OUT/ncu.txt | sed -E 's/ +/ /g' | cut -c1-100
sed -E 's/ per step, ([0-9]+) GB\/s of ([0-9.]+) MB compressed, ([0-9]+) units, ([0-9]+) sets, pdl (true|false), ([0-9]+)-warp CTAs of ([0-9]+) B, merge kernel/ \1GB\/s \3u pdl=\5 \6w/' $OUT/tq.txt
