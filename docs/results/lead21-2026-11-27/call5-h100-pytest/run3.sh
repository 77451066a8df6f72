#!/bin/bash
# Lead, twenty-first session: the Python suite on the GPU from the abi3 wheel .ci/run built (main 2d4553c), verbose,
# the failing cp test first on its own with its traceback.
B=$(cd "$(dirname "$0")" && pwd); R=$(cd "$B/.." && pwd); cd "$B"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH FERRATTN_CACHE_DIR=/tmp/ferrattn-cache-l21p
mkdir -p $FERRATTN_CACHE_DIR; W=/tmp/o21p; mkdir -p $W; S=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; cat WHEEL; } > $W/info.txt
rm -rf /tmp/site-l21; python3 -m pip install -q --no-index --no-deps --target /tmp/site-l21 wheels/*.whl > $W/pip.txt 2>&1
cd /tmp
PYTHONPATH=/tmp/site-l21 timeout 150 python3 -m pytest -v -p no:cacheprovider --rootdir=/tmp "$R/python/tests/test_cp.py::test_context_parallel_attention_over_a_process_group_equals_whole_attention" > $W/pytest_cp.log 2>&1
echo "cp rc=$? at +$(( $(date +%s) - S ))s" >> $W/info.txt
PYTHONPATH=/tmp/site-l21 timeout 400 python3 -m pytest -v -rfEs -p no:cacheprovider --rootdir=/tmp --durations=15 $R/python/tests > $W/pytest.log 2>&1
echo "suite rc=$? at +$(( $(date +%s) - S ))s" >> $W/info.txt
date -u >> $W/info.txt; cd $W && tar czf $OUT/l21p.tgz *; cat info.txt; grep -E 'FAILED|Error|error' pytest_cp.log | head -20; tail -40 pytest.log
