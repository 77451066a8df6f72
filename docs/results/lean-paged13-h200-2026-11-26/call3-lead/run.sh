#!/bin/bash
# Thirteenth session, lead's call: the two untested hypotheses of "Lean paged, thirteenth session". lean_paged of main
# (4903ce5 kernels, FERRATTN_LEAN_STAGES default: 3 stages where they fit), of main with FERRATTN_LEAN_STAGES=4 (a
# deeper ring), and of issue-9-paged-rows-early (1a942ab: pool rows into registers before each stage's barrier),
# interleaved twice over the full list, and at one CTA per SM (--same-plan) on Lean-paper B=1 ctx 64k and B=4 ctx 16k.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
P=$OUT/paged.txt
for r in 1 2; do for v in main s4 early; do echo "== round $r $v full list" >> $P; timeout 25 ./lean_paged_$v --out /tmp/$v$r.json >> $P 2>&1; echo "rc=$?" >> $P; cp /tmp/$v$r.json $OUT/${v}_$r.json 2>/dev/null; done; done
for v in main s4 early main s4 early; do for o in lean:1:65536 lean:4:16384; do echo "== $v --same-plan $o" >> $P; timeout 15 ./lean_paged_$v --same-plan --only $o >> $P 2>&1; done; done
cat $P | grep -v '^$' | head -150
