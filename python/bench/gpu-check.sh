#!/usr/bin/env bash
# The binding's check on the GPU machine (torch there; no Rust toolchain): the abi3 wheel built
# elsewhere, installed into /tmp/site, the pytest suite with CUDA tensors, the per-call overhead
# benchmark and the 32-layer decode-step graph benchmark; with a Rust test binary beside the
# wheel (`gpu_device_api-*`, built with NVCC so its kernels are embedded), the facade's GPU tests
# too. Run from a bundle folder holding the wheel, tests/ and bench/ (see python/README.md);
# writes pytest.log, overhead.json, decode_graph.json and rust.log under $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site ferrattn-*.whl || exit 1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, ferrattn; print("torch", torch.__version__, "ferrattn", ferrattn.GIT_COMMIT)'
rc=0
for t in gpu_device_api-*; do
    [ -x "$t" ] || continue
    timeout "${RUST_TIMEOUT:-90}" "./$t" --test-threads=1 2>&1 | tee "$OUT/rust.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    grep -q SKIPPED "$OUT/rust.log" && rc=1 # on the GPU machine a skip is a failure
done
timeout "${PYTEST_TIMEOUT:-240}" python3 -m pytest -p no:cacheprovider -ra -q --durations=8 tests 2>&1 | tee "$OUT/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
timeout 90 python3 bench/overhead.py 2>&1 | tee "$OUT/overhead.json"
timeout "${GRAPH_TIMEOUT:-120}" python3 bench/decode_graph.py > "$OUT/decode_graph.json" 2> "$OUT/decode_graph.log"
echo "decode_graph rc=$?"; cat "$OUT/decode_graph.log"
exit "$rc"
