#!/bin/bash
# Lead, twenty-first session, H100 call: the fast prefill of main (708b0c2: the pre-passes without a division) against
# e13f40a's, interleaved 3 rounds with PyTorch SDPA in the same call; gpu_turbo prefill tests and the TurboAttention
# sanitizer grid; then the Python suite from the abi3 wheel that .ci/run built on a fresh clone of main.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"; tar xJf b.tar.xz || exit 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l21h
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21h; mkdir -p $W
S=$(date +%s); ts() { echo "[+$(( $(date +%s) - S ))s] $*"; }
I=$W/info.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; cat COMMIT; cat WHEEL; } > $I
SH="4 4096 1 32768 --causal both --only fast --inputs both"
for ob in "base 1" "new 1" "new 2" "base 2" "base 3" "new 3"; do set -- $ob
  timeout 50 ./tp_$1 $SH > $W/bench_$1_$2.txt 2>&1; echo "$(ts) bench $1 $2 rc=$?" >> $I
  [ "$1 $2" = "new 1" ] && { timeout 50 python3 $R/scripts/bench_sdpa.py jobs-prefill.json $W/sdpa.json > $W/sdpa_log.txt 2>&1; echo "$(ts) sdpa rc=$?" >> $I; }
done
timeout 150 ./gpu_turbo prefill --include-ignored --test-threads=1 > $W/t_prefill.txt 2>&1; echo "$(ts) gpu_turbo prefill rc=$?: $(grep 'test result' $W/t_prefill.txt | tail -1)" >> $I
for tool in memcheck racecheck; do
  FERRATTN_GPU_TEST_SCALE=small timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 > $W/san_$tool.txt 2>&1; rc=$?
  echo "$(ts) $tool rc=$rc: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' $W/san_$tool.txt)" >> $I; done
rm -rf /tmp/site-l21; python3 -m pip install -q --no-index --no-deps --target /tmp/site-l21 wheels/*.whl > $W/pip.txt 2>&1; echo "$(ts) pip rc=$?" >> $I
(cd /tmp && PYTHONPATH=/tmp/site-l21 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $W/pytest.log 2>&1; echo "$(ts) pytest rc=$?: $(tail -1 $W/pytest.log)" >> $I)
date -u >> $I; cd $W && tar czf $OUT/l21h.tgz *; cat $I
for f in $W/bench_*; do echo "$(basename $f)"; grep -o "prefill .* ms total" $f; done
python3 -c "
import json;d=json.load(open('$W/sdpa.json'));print(d.get('ceilings'));[print(r.get('cudnn',{}).get('median_ms'), r.get('flash',{}).get('median_ms')) for r in d['results']]"
