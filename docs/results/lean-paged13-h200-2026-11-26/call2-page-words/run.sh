#!/bin/bash
# Thirteenth session, call 2 (issue-9-paged-bulk): one page-word copy per page and warp in the paged-ahead kernels.
# lean_paged of main (4903ce5) and of the branch, interleaved twice over the full list; gpu_lean (NVRTC included),
# gpu_device_api; memcheck/racecheck on both small Lean grids; both with --ahead always; ncu of Lean-paper B=1 ctx 64k at one CTA per SM
# (--same-plan, in-order pools: the contiguous cache's addresses) for main's and the branch's paged-ahead kernels.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; [ -f b.tar.xz ] && tar xJf b.tar.xz --exclude=run2.sh; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p13b
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for v in main new main new; do ts "$v full list" >> $P; timeout 20 ./lean_paged_$v --out /tmp/$v.json >> $P 2>&1; cp /tmp/$v.json $OUT/$v.json; done
for v in main new; do ts "$v --ahead always (the paged-ahead instance on every grid)" >> $P; timeout 20 ./lean_paged_$v --ahead always >> $P 2>&1; done
cat $P
T=$OUT/tests.txt
ts "gpu_lean" >> $T; timeout 75 ./gpu_lean --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
ts "gpu_device_api" >> $T; timeout 25 ./gpu_device_api --include-ignored --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert|SKIPPED" >> $T
for t in lean_device::gpu_device_sanitizer_small gpu_sanitizer_small_grid; do for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 22 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_lean $t --exact --include-ignored --test-threads=1 > /tmp/san.txt 2>&1
  echo "$(ts) $tool $t rc=$?: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)" >> $T; grep -m2 -A12 "Error\|Hazard\|panicked" /tmp/san.txt >> $T
done; done
cat $T
N=/tmp/ncu; mkdir -p $N
prof() { # name binary regex skip
  timeout 15 ncu -k "$3" --launch-skip $4 --launch-count 1 --section SpeedOfLight --section WarpStateStats --metrics smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum -o $N/$1 ./$2 --only lean:1:65536 --same-plan --sets 1 > $N/$1.log 2>&1
  ncu -i $N/$1.ncu-rep --page details > $N/$1.txt 2>&1
  echo "$(ts) $1: $(grep -E 'Duration|smsp__inst_executed.sum|wavefronts_mem_shared.sum|Warp Cycles Per Issued' $N/$1.txt | tr -s ' ' | tr '\n' ' ')" >> $OUT/ncu.txt
}
prof main_p64o lean_paged_main "regex:lean_decode_paged_ahead" 60
prof new_p64o lean_paged_new "regex:lean_decode_paged_ahead" 60
prof main_p16o lean_paged_main "regex:lean_decode_paged_ahead" 40
prof new_p16o lean_paged_new "regex:lean_decode_paged_ahead" 40
cat $OUT/ncu.txt; cd $N && tar czf $OUT/ncu.tgz *.txt *.log
ts done
