#!/bin/bash
# Thirteenth session, call 1: main 4903ce5 + the peer harness. The Python suite from the abi3 wheel with the CLI (the
# CUDA TurboCache prefill-workspace fix a835673 had not run on a GPU), and TurboQuant decode timings: ours (k4-v3 and
# k4q-v3), PyTorch SDPA and the copy ceiling, and vLLM's public Triton TurboQuant decode (k4-v3, kept outside the
# repository in .peers/, scripts/bench_peer_turboquant.py), all in this one call.
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-v13a
R=$(cd "$B/.." && pwd); D=$R/docs/results/h200-2026-11-26-v13-verify
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat COMMIT; } > $OUT/env.txt 2>&1; cat $OUT/env.txt
T=$OUT/tests.txt
rm -rf /tmp/site-v13a; python3 -m pip install -q --no-index --no-deps --target /tmp/site-v13a wheels/*.whl > /dev/null 2>&1
(cd /tmp && FERRATTN_CLI=$B/ferrattn PYTHONPATH=/tmp/site-v13a timeout 200 python3 -m pytest -q -rs -p no:cacheprovider --rootdir=/tmp $R/python/tests > $OUT/pytest.log 2>&1; echo "pytest rc=$?" >> $T)
tail -3 $OUT/pytest.log
M=$OUT/tq-timing.txt
for round in 1 2; do for s in "1 32768 --sets 4" "1 16384 --sets 4" "1 131072" "16 16384" "32 32768"; do
  echo "-- round $round tqdecode $s" >> $M; timeout 40 ./tqdecode $s --config k4q-v3,k4-v3 2>&1 | grep -E "turboquant|error" >> $M; done
  [ $round = 1 ] && { timeout 120 python3 $R/scripts/bench_peer_turboquant.py $R/.peers/vllm_tq/tq_decode.py $D/peer-jobs.json $OUT/peer.json > $OUT/peer.txt 2>&1; echo "peer rc=$?" >> $T; }
done
cat $M; grep -v Warning $OUT/peer.txt | tail -8
timeout 90 python3 $R/scripts/bench_sdpa.py $D/tq-jobs.json $OUT/tq-sdpa.json > $OUT/tq-sdpa.txt 2>&1; echo "sdpa rc=$?" >> $T
grep -v Warning $OUT/tq-sdpa.txt | tail -7; cat $T
