#!/usr/bin/env bash
# Runs on the GPU machine from a bundle made by scripts/gpu-bundle.sh (copied there as
# run-device.sh): the device-path tests of issue 9 (gpu_lean_device), compute-sanitizer memcheck
# and racecheck on their small cases, the paged-vs-contiguous benchmark, the existing Lean GPU
# tests, and, while the time budget lasts, the quick Llama Lean table with the SDPA baseline.
#   bash .gpu-bundle/run-device.sh [BUDGET_SECONDS]
# Steps start only while SECONDS < BUDGET (default 230), so the call ends inside a short lease.
set -uo pipefail
BUDGET="${1:-230}"
# shellcheck source=/dev/null
source "$(cd "$(dirname "$0")" && pwd)/gpu-env.sh"
left() { [ "$SECONDS" -lt "$BUDGET" ] || { summary+=("skipped (budget): $1"); return 1; }; }

echo "== unit tests"
timeout 60 "$B/unit_tests" 2>&1 | tail -n 2
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; summary+=("unit tests FAILED"); }

echo "== device-path GPU tests"
t0=$SECONDS
timeout 120 "$B/gpu_lean_device" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$OUT/device_tests.txt" |
  grep -E "^test |test result|SKIPPED|panicked|equal eager|failures"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { status=1; summary+=("device tests FAILED ($rc)"); }
grep -q "SKIPPED " "$OUT/device_tests.txt" && { status=1; summary+=("a device test SKIPPED"); }
summary+=("device tests: $(grep 'test result' "$OUT/device_tests.txt" | tail -n 1) in $((SECONDS - t0)) s")

for tool in memcheck racecheck; do
  left "sanitizer $tool" || continue
  echo "== compute-sanitizer $tool (small device cases)"
  t0=$SECONDS
  FERRATTN_GPU_TEST_SCALE=small timeout 80 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$B/gpu_lean_device" gpu_device_sanitizer_small --exact --include-ignored --test-threads=1 >"$OUT/san_$tool.txt" 2>&1
  s=$?
  tail -n 3 "$OUT/san_$tool.txt"
  if [ $s -ne 0 ]; then status=1; summary+=("compute-sanitizer $tool: exit $s"); else
    summary+=("compute-sanitizer $tool: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.txt") ($((SECONDS - t0)) s)"); fi
done

if left "paged bench"; then
  echo "== paged vs contiguous, cooperative vs plain (us per launch, graph-timed medians)"
  # PAGED_ARGS="" for all configurations (default --quick)
  timeout 90 "$B/lean_paged" ${PAGED_ARGS---quick} --out "$OUT/paged.json" 2>&1 | tee "$OUT/paged.txt" || { status=1; summary+=("paged bench FAILED"); }
fi

if left "existing Lean GPU tests"; then
  echo "== existing Lean GPU tests (the prepared path now runs on the device path)"
  t0=$SECONDS
  timeout 100 "$B/gpu_lean" --include-ignored --test-threads=1 2>&1 | tee "$OUT/gpu_lean.txt" | grep -E "test result|FAILED|panicked|SKIPPED"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { status=1; summary+=("gpu_lean FAILED or timed out ($rc)"); }
  summary+=("gpu_lean: $(grep 'test result' "$OUT/gpu_lean.txt" | tail -n 1) in $((SECONDS - t0)) s")
fi

if left "Lean table + SDPA"; then
  echo "== quick Llama Lean table with SDPA"
  timeout 90 "$B/lean_decode" --quick --tables llama --out "$OUT/lean.json" >"$OUT/bench_log.txt" 2>&1 &&
    PYTHONUNBUFFERED=1 timeout 90 python3 "$B/sdpa_bench.py" "$OUT/lean.json" "$OUT/sdpa.json" >/dev/null 2>&1 &&
    python3 "$B/gpu-report.py" "$OUT/lean.json" "$OUT/sdpa.json" >"$OUT/table.md" && cat "$OUT/table.md" ||
    summary+=("Lean table: not completed")
fi

echo
echo "==================== summary ($FERRATTN_COMMIT, $(date -u +%F))"
printf '%s\n' "${summary[@]}"
exit $status
