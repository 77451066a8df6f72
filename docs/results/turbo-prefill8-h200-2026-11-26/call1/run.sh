#!/bin/bash
# issue-11-prefill8 device call 1: the prefill tests + sanitizers of the new binary (the host-only
# twin test skipped: run on the host), then main's fast prefill (bench_main, built in a detached
# worktree of main 10ab25d with this branch's bench) and this branch's (bench_new) interleaved, on
# uniform and LLM-like inputs, with the paths the query blocks take (--paths).
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
timeout 70 ./gpu_turbo_new prefill nvrtc --include-ignored --skip fast_prefill_twin_is_as_accurate --test-threads=1 --nocapture > $W/tests_new.txt 2>&1; echo "tests new rc=$? t=$(el)" >> $W/info.txt
{ timeout 12 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 14 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
U="4 1024 4 4096 1 16384 1 32768 --only fast"
L="4 1024 4 4096 1 16384 --only fast --inputs llm"
if [ $(el) -lt 85 ]; then timeout 14 ./bench_main $U > $W/bench_main_u1.txt 2>&1; echo "bench main u1 rc=$? t=$(el)" >> $W/info.txt; fi
if [ $(el) -lt 95 ]; then timeout 14 ./bench_new $U > $W/bench_new_u1.txt 2>&1; echo "bench new u1 rc=$? t=$(el)" >> $W/info.txt; fi
if [ $(el) -lt 100 ]; then timeout 18 ./bench_new $L --paths > $W/bench_new_l1.txt 2>&1; echo "bench new l1 rc=$? t=$(el)" >> $W/info.txt; fi
if [ $(el) -lt 106 ]; then timeout $((117 - $(el))) ./bench_main $L > $W/bench_main_l1.txt 2>&1; echo "bench main l1 rc=$? t=$(el)" >> $W/info.txt; fi
cd $W && tar czf $OUT/results.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked' tests_new.txt | head; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_u1 bench_new_u1 bench_new_l1 bench_main_l1; do echo $f; cat $f.txt 2>/dev/null; done; cd $OUT && rm -rf s
