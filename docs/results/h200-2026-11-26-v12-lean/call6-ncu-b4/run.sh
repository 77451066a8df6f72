#!/bin/bash
# Twelfth session, call 6: Lean-paper B=4 ctx 16k at one CTA per SM (--same-plan, 112 CTAs, two whole tiles per CTA):
# the contiguous kernel against the paged-ahead kernel over the in-order pool of 64, ncu source counters.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
timeout 60 ./lean_paged --only lean:4:16384 --same-plan > $OUT/timing.txt 2>&1; cat $OUT/timing.txt
run() { # name regex skip
  timeout 120 ncu -k "$2" --launch-skip $3 --launch-count 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats -o /tmp/$1 ./lean_paged --only lean:4:16384 --same-plan --sets 1 > /tmp/$1.log 2>&1
  ncu -i /tmp/$1.ncu-rep --page details > $OUT/$1_details.txt 2>&1
  ncu -i /tmp/$1.ncu-rep --page source --csv --print-source sass > /tmp/$1_src.csv 2>&1
  grep -E "Duration|DRAM Throughput|Grid Size|Warp Cycles Per Issued|Eligible Warps" $OUT/$1_details.txt | head -8
}
run contig "regex:^lean_decode_f16" 3
run p64o "regex:lean_decode_paged_ahead" 60
cd /tmp && tar czf $OUT/src.tgz contig_src.csv p64o_src.csv *.log
