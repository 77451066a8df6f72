#!/bin/bash
# Twelfth session, call 3: where the paged kernel loses at identical addresses. Lean-paper B=1 ctx 64k on 112 CTAs:
# the contiguous kernel and the paged-ahead kernel over the in-order pools of 16 and of 64 (for batch 1 the pool is
# laid out exactly as the contiguous cache), ncu source counters (SASS, stall samples per instruction).
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
timeout 60 ./lean_paged --only lean:1:65536 > $OUT/timing.txt 2>&1; cat $OUT/timing.txt
run() { # name regex skip
  timeout 120 ncu -k "$2" --launch-skip $3 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight --section SchedulerStats --section MemoryWorkloadAnalysis -o /tmp/$1 ./lean_paged --only lean:1:65536 --sets 1 > /tmp/$1.log 2>&1
  ncu -i /tmp/$1.ncu-rep --page details > $OUT/$1_details.txt 2>&1
  ncu -i /tmp/$1.ncu-rep --page source --csv --print-source sass > /tmp/$1_src.csv 2>&1
  grep -E "Duration|DRAM Throughput|Issue Slots|Warp Cycles Per Issued|Stall|Eligible" $OUT/$1_details.txt | head -20
}
run contig "regex:^lean_decode_f16" 3
run p16o "regex:lean_decode_paged_ahead" 40
run p64o "regex:lean_decode_paged_ahead" 60
cd /tmp && tar czf $OUT/src.tgz contig_src.csv p16o_src.csv p64o_src.csv *.log
ls -la $OUT
