#!/usr/bin/env bash
# The binding's check on the GPU machine (torch there; no Rust toolchain): the abi3 wheel built
# elsewhere, installed into /tmp/site, the pytest suite with CUDA tensors and the per-call
# overhead benchmark. Run from a bundle folder holding the wheel, tests/ and bench/ (see
# python/README.md); writes pytest.log and overhead.json under $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site ferrattn-*.whl || exit 1
export PYTHONPATH=/tmp/site LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, ferrattn; print("torch", torch.__version__, "ferrattn", ferrattn.GIT_COMMIT)'
timeout "${PYTEST_TIMEOUT:-240}" python3 -m pytest -p no:cacheprovider -ra -q --durations=8 tests 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
timeout 90 python3 bench/overhead.py 2>&1 | tee "$OUT/overhead.json"
exit "$rc"
