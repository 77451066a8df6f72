#!/usr/bin/env bash
# Context-parallel decode on the GPU machine (issue 14), from a folder holding release builds of
# the `gpu_cp` test and the `cp_decode` benchmark (copied there with this script as run-cp.sh):
#   1. gpu_cp on every GPU (one thread and one GPU per rank), then on one GPU (a one-rank
#      communicator runs the whole path);
#   2. compute-sanitizer memcheck of gpu_cp_sanitizer_small on one rank (Lean, NCCL, the merge
#      kernels), then once more restricted to the merge kernels (cp_*). API errors are not
#      reported: NCCL's own cudaFuncGetAttributes probes return cudaErrorNoKernelImageForDevice
#      (8 per run on 2 x H200, 2026-11-23); memory errors of every kernel are;
#   3. the cp_decode benchmark (JSON to $OUT/cp_decode.json).
# NCCL is found the way a user's run finds it (FERRATTN_NCCL_LIB unset: the loader, then
# PyTorch's wheel through python3's sys.path). NVLink multicast stays off (shared machines).
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
status=0
summary=()
{
  date -u
  cat "$B/COMMIT" 2>/dev/null
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvidia-smi topo -m
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
} 2>&1 | tee "$OUT/env.txt"

run() { # name, then the command
  local name="$1" t0=$SECONDS rc
  shift
  echo "== $name"
  "$@" >"/tmp/cp-$name.txt" 2>&1
  rc=$?
  grep -E "^(ok|test )|test result|panicked|SKIPPED|ERROR SUMMARY|error" "/tmp/cp-$name.txt" | tail -n 40
  { echo "== $name (exit $rc, $((SECONDS - t0)) s)"; cat "/tmp/cp-$name.txt"; } >>"$OUT/tests.txt"
  [ $rc -eq 0 ] || { status=1; summary+=("$name: exit $rc"); }
  if grep -q "SKIPPED " "/tmp/cp-$name.txt"; then status=1; summary+=("$name: a GPU test SKIPPED"); fi
  summary+=("$name: exit $rc, $((SECONDS - t0)) s")
}

run tests-all-gpus timeout 80 "$B/gpu_cp" --include-ignored --test-threads=1 --nocapture
FERRATTN_CP_RANKS=1 run tests-one-rank timeout 50 "$B/gpu_cp" --include-ignored --test-threads=1 --nocapture
FERRATTN_CP_RANKS=1 FERRATTN_GPU_TEST_SCALE=small run memcheck-one-rank timeout 60 \
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$B/gpu_cp" gpu_cp_sanitizer_small --exact --include-ignored --test-threads=1
FERRATTN_CP_RANKS=1 run memcheck-merge-kernels timeout 40 \
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 --kernel-name kns=cp_ "$B/gpu_cp" gpu_cp_sanitizer_small --exact --include-ignored --test-threads=1
if ls "$B"/ferrattn-*.whl >/dev/null 2>&1; then
  # the Python binding: merge_states and context_parallel_attention over gloo and NCCL groups
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/cp-site "$B"/ferrattn-*.whl
  PYTHONPATH=/tmp/cp-site run python timeout 120 python3 -m pytest -p no:cacheprovider -q -rs "$B/pytests/test_cp.py"
fi
echo "== cp_decode benchmark"
t0=$SECONDS
timeout "${BENCH_TIMEOUT:-110}" "$B/cp_decode" --out "$OUT/cp_decode.json" 2>&1 | tee "$OUT/bench.txt"
rc=${PIPESTATUS[0]}
[ $rc -eq 0 ] || { status=1; summary+=("bench: exit $rc"); }
summary+=("bench: exit $rc, $((SECONDS - t0)) s")
echo
echo "==================== summary ($(cat "$B/COMMIT" 2>/dev/null))"
printf '%s\n' "${summary[@]}"
exit $status
