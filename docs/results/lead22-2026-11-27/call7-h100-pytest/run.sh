#!/bin/bash
# Lead, twenty-second session, last call: the Python suite on the GPU from the abi3 wheel .ci/run built on a fresh clone
# (kernels through NVRTC, so the one-pass Lean merge is JIT-compiled on the GPU machine), verbose.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l22f
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o22f; mkdir -p $W; S=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat WHEEL; } > $W/info.txt
rm -rf /tmp/site-l22; python3 -m pip install -q --no-index --no-deps --target /tmp/site-l22 wheels/*.whl > $W/pip.txt 2>&1; rc=$?
echo "pip rc=$rc" >> $W/info.txt
cd /tmp
PYTHONPATH=/tmp/site-l22 timeout 500 python3 -m pytest -v -rfEs -p no:cacheprovider --rootdir=/tmp --durations=15 $R/python/tests > $W/pytest.log 2>&1; rc=$?
echo "suite rc=$rc at +$(( $(date +%s) - S ))s" >> $W/info.txt
date -u >> $W/info.txt; cd $W && tar czf $OUT/l22f.tgz *; cat info.txt; grep -E 'FAILED|ERROR' pytest.log | head -20; tail -30 pytest.log
