#!/bin/bash
# issue-11-prefill20 (helper), call 3: call 2's timelines again (call 2 forgot the trace folders), and ncu
# (ComputeWorkloadAnalysis + InstructionStats, per-pipe raw metrics) of one 4 x 4096 non-causal launch of main and new.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; [ -x turbo_prefill_tlmain ] || tar xJf b2.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-p20
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o20c; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; echo "main: a602be2; new: issue-11-prefill20 $(cat commit.txt)"; } > $I
for t in tlmain tlnoshift; do mkdir -p $W/$t
  FERRATTN_WGF_TRACE=1 timeout 25 ./turbo_prefill_$t 4 4096 1 32768 --causal no --only fast --inputs uniform --trace $W/$t > $W/${t}_bench.txt 2>&1; echo "$(ts) $t rc=$?" >> $I
  xz -6 $W/$t/*.bin; done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for b in main new; do
  timeout 40 $NCU --clock-control none -k regex:turbo_prefill_wgf -c 1 --section ComputeWorkloadAnalysis --section InstructionStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum -o /tmp/ncu-$b -f ./turbo_prefill_$b 4 4096 --causal no --only fast --inputs uniform > $W/ncu-$b.log 2>&1
  echo "$(ts) ncu $b rc=$?" >> $I
  $NCU -i /tmp/ncu-$b.ncu-rep --page raw > $W/ncu-$b-raw.txt 2>&1; $NCU -i /tmp/ncu-$b.ncu-rep --page details > $W/ncu-$b.txt 2>&1
done
date -u >> $I; cd $W && tar czf $OUT/p20c.tgz *; cat $I; grep -h "fast:" $W/tl*_bench.txt
for b in main new; do echo "== $b"; grep -E "pipe_(alu|fma|fmaheavy|fmalite|fp16|uniform|xu|lsu|adu|cbu|tensor)[a-z_]*\.(avg|sum)\.pct_of_peak_sustained_active|gpu__time_duration.sum|smsp__inst_executed.sum " $W/ncu-$b-raw.txt | head -40; done
