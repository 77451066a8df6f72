#!/bin/bash
# issue-11-prefill2 device call 2: turbo_prefill old fast (main 12ff90d) vs v1 (7b96a2b) vs v3 (9ae3281),
# SDPA; prefill tests (--include-ignored) + sanitizer of the faster of v1/v3 first, then of the other
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader; date -u +%FT%TZ; echo "old=main 12ff90d v1=7b96a2b v3=9ae3281"; } > $OUT/info.txt
SH="4 1024 4 4096 1 16384 1 32768 --only fast"
for k in old v1 v3; do timeout 40 ./bench_$k $SH > $OUT/bench_${k}_1.txt 2>&1; echo "bench $k t=$(el)" >> $OUT/info.txt; done
timeout 60 python3 bench_sdpa.py jobs.json $OUT/sdpa.json 2> $OUT/sdpa_log.txt; echo "sdpa rc=$? t=$(el)" >> $OUT/info.txt
W=$(python3 - $OUT <<'PY'
import sys,re,math
def tot(f):
    return [float(m.group(1)) for m in re.finditer(r'fast: ([0-9.]+) ms total', open(f).read())]
o,a,b=(tot(f"{sys.argv[1]}/bench_{k}_1.txt") for k in ("old","v1","v3"))
g=lambda x: math.exp(sum(math.log(p/q) for p,q in zip(o,x))/len(x)) if len(x)==len(o)==8 else 0
print("v3" if g(b)>g(a) else "v1")
PY
)
O=v1; [ "$W" = v1 ] && O=v3
echo "winner $W t=$(el)" >> $OUT/info.txt
for k in $W $O; do
  if [ $k = $O ] && [ $(el) -gt 130 ]; then echo "skip tests $k" >> $OUT/info.txt; break; fi
  timeout 90 ./gpu_turbo_$k prefill nvrtc --include-ignored --test-threads=1 --nocapture > $OUT/tests_$k.txt 2>&1; echo "tests $k rc=$? t=$(el)" >> $OUT/info.txt
  { timeout 30 compute-sanitizer --tool memcheck ./gpu_turbo_$k gpu_turbo_sanitizer_small --include-ignored; timeout 40 compute-sanitizer --tool racecheck ./gpu_turbo_$k gpu_turbo_sanitizer_small --include-ignored; } > $OUT/sanitizer_$k.txt 2>&1; echo "sanitizer $k t=$(el)" >> $OUT/info.txt
done
if [ $(el) -lt 190 ]; then for k in v3 v1 old; do timeout 12 ./bench_$k $SH > $OUT/bench_${k}_2.txt 2>&1; echo "bench $k 2 t=$(el)" >> $OUT/info.txt; done; fi
cd $OUT && tar czf results.tgz *.txt *.json && rm -f *.txt *.json && ls -la
