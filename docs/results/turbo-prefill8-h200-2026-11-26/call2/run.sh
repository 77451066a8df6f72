#!/bin/bash
# issue-11-prefill8 device call 2 (72 s of the brief's 180 left): main (bench_main: 10ab25d's kernel
# with this branch's bench) and this branch (bench_new, 115b611) interleaved once on uniform and
# LLM-like inputs, SDPA on 4 x 4096 and 1 x 16384, then the fast-prefill twin test and memcheck.
cd "$(dirname "$0")"; B=$(pwd)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
W=$OUT/w; mkdir -p $W
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; cat COMMIT; } > $W/info.txt
U="4 4096 1 16384 1 32768 --only fast"
L="4 4096 1 16384 --only fast --inputs llm"
timeout 9 ./bench_main $U > $W/bench_main_u2.txt 2>&1; echo "bench main u2 rc=$? t=$(el)" >> $W/info.txt
timeout 9 ./bench_new $U > $W/bench_new_u2.txt 2>&1; echo "bench new u2 rc=$? t=$(el)" >> $W/info.txt
timeout 10 ./bench_new $L > $W/bench_new_l2.txt 2>&1; echo "bench new l2 rc=$? t=$(el)" >> $W/info.txt
timeout 10 ./bench_main $L > $W/bench_main_l2.txt 2>&1; echo "bench main l2 rc=$? t=$(el)" >> $W/info.txt
timeout 9 python3 bench_sdpa.py jobs2.json $W/sdpa.json 2> $W/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $W/info.txt
R=$((61 - $(el))); if [ $R -gt 5 ]; then timeout $R ./gpu_turbo_new gpu_turbo_fast_prefill_matches_its_twin --include-ignored --test-threads=1 --nocapture > $W/tests_new.txt 2>&1; echo "twin test rc=$? t=$(el)" >> $W/info.txt; fi
{ timeout 4 compute-sanitizer --tool memcheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; timeout 5 compute-sanitizer --tool racecheck ./gpu_turbo_new gpu_turbo_sanitizer_small --include-ignored; } > $W/sanitizer_new.txt 2>&1; echo "sanitizer new t=$(el)" >> $W/info.txt
cd $W && tar czf $OUT/results.tgz . && rm -rf $W
echo "---- summary"; cd $OUT; mkdir -p s && tar xzf results.tgz -C s && cd s && cat info.txt; grep -h 'test result\|FAILED\|panicked\|95x\|flat rows' tests_new.txt | cut -c1-220 | head -12; grep -h 'ERROR SUMMARY\|RACECHECK SUMMARY' sanitizer_new.txt; for f in bench_main_u2 bench_new_u2 bench_new_l2 bench_main_l2; do echo $f; cat $f.txt 2>/dev/null; done; python3 -c "
import json;d=json.load(open('sdpa.json'))
for r in d['results']: print('cudnn %.4f flash %.4f' % (r['cudnn']['median_ms'], r['flash']['median_ms']))"; cd $OUT && rm -rf s
