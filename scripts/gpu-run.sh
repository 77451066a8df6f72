#!/usr/bin/env bash
# Runs on the GPU machine from a folder made by scripts/gpu-bundle.sh (copied there as run.sh):
#   bash .gpu-bundle/run.sh [smoke|tests|bench|full]
# smoke: unit + GPU tests, sanitizers, quick bench. tests: tests + sanitizers. bench: the
# benchmark tables. full: everything. Logs and JSON go to $OUT (or ./out); a short table is
# printed last. Exits non-zero if a test fails or any GPU test printed SKIPPED. At most 8 files
# come back from the device tool: gpu_tests.txt, sanitizer.txt, bench_log.txt, lean.json,
# lean_rerun.json, sdpa.json, table.md (+ whatever log the caller tees there).
set -uo pipefail
MODE="${1:-full}"
# shellcheck source=/dev/null
source "$(cd "$(dirname "$0")" && pwd)/gpu-env.sh"

run_tests() {
  echo "== unit tests"
  "$B/unit_tests" 2>&1 | tail -n 3
  [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; summary+=("unit tests FAILED"); }
  echo "== GPU tests"
  local t0=$SECONDS
  timeout 400 "$B/gpu_lean" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "$OUT/gpu_tests.txt" | grep -E "^test |test result|SKIPPED|panicked|failures" 
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then status=1; summary+=("GPU tests FAILED (see gpu_tests.txt)"); fi
  if grep -q "SKIPPED " "$OUT/gpu_tests.txt"; then status=1; summary+=("a GPU test SKIPPED on the GPU machine"); fi
  summary+=("GPU tests: $(grep 'test result' "$OUT/gpu_tests.txt" | tail -n 1) in $((SECONDS - t0)) s")
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool (small grid)"
    FERRATTN_GPU_TEST_SCALE=small timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$B/gpu_lean" gpu_sanitizer_small_grid --exact --include-ignored --test-threads=1 >/tmp/sanitizer_$tool.txt 2>&1
    local s=$?
    cat /tmp/sanitizer_$tool.txt >>"$OUT/sanitizer.txt"
    tail -n 4 /tmp/sanitizer_$tool.txt
    if [ $s -ne 0 ]; then status=1; summary+=("compute-sanitizer $tool: exit $s"); else summary+=("compute-sanitizer $tool: clean ($(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/sanitizer_$tool.txt))"); fi
  done
}

run_bench() {
  local quick="$1"
  echo "== Lean benchmark $quick"
  timeout 420 "$B/lean_decode" $quick --out "$OUT/lean.json" 2>&1 | tee "$OUT/bench_log.txt" | tail -n 60
  [ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; summary+=("bench FAILED"); return; }
  echo "== PyTorch SDPA (same command)"
  PYTHONUNBUFFERED=1 timeout 300 python3 "$B/sdpa_bench.py" "$OUT/lean.json" "$OUT/sdpa.json" 2>&1 | tail -n 60
  echo "== Lean benchmark again (run-to-run spread)"
  timeout 420 "$B/lean_decode" $quick --out "$OUT/lean_rerun.json" >>"$OUT/bench_log.txt" 2>&1 || status=1
  python3 "$B/gpu-report.py" "$OUT/lean.json" "$OUT/sdpa.json" "$OUT/lean_rerun.json" >"$OUT/table.md" || status=1
}

run_profile() {
  # Nsight Compute on the first stream-K launches of the smallest Llama decode (where the kernel is
  # furthest from SDPA): duration, occupancy, and where warps stall. Clocks left alone.
  echo "== probe (graph-timed small decodes under several schedules)"
  timeout 120 "$B/lean_decode" --probe 2>&1 | grep probe
  echo "== ncu (llama B=1 ctx=1024, stream-K): stall reasons"
  timeout 240 ncu --clock-control none -k regex:lean_decode -c 1 --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --print-details all \
    "$B/lean_decode" --quick --tables llama --out /tmp/ncu_bench.json >"$OUT/ncu.txt" 2>&1
  grep -E "lean_|Duration|Elapsed Cycles|SM Active Cycles|Stall|stall" "$OUT/ncu.txt" | head -60
}

case "$MODE" in
  smoke) run_tests; run_bench --quick ;;
  tests) run_tests ;;
  bench) run_bench "" ;;
  full) run_tests; echo "== probe"; timeout 120 "$B/lean_decode" --probe 2>&1 | grep probe; run_bench "" ;;
  profile) run_profile ;;
  profile+bench) run_profile; run_bench "" ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac

echo
echo "==================== summary ($FERRATTN_COMMIT, $(date -u +%F))"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/table.md" ] && cat "$OUT/table.md"
exit $status
