#!/usr/bin/env bash
# Runs on the GPU machine from a folder holding the stripped binaries `gpu_turbo` (test),
# `unit_tests` (ferrattn-cuda lib tests) and `turbo` (bench), this script, turbo_sdpa.py and
# COMMIT (see backends/cuda/benches/turbo-bundle.sh). Each mode fits in 8 minutes:
#   bash <folder>/run.sh tests   # GPU tests, then compute-sanitizer memcheck and racecheck (small)
#   bash <folder>/run.sh bench   # a correctness gate, then the benchmark and PyTorch SDPA
# Logs and JSON go to $OUT (or <folder>/out); a short summary is printed last. Exits non-zero
# when a test fails, a GPU test printed SKIPPED, or a sanitizer reports an error.
set -uo pipefail
MODE="${1:-tests}"
# shellcheck source=/dev/null
source "$(cd "$(dirname "$0")" && pwd)/gpu-env.sh"

run_tests() {
  # (the unit tests are host tests: they run on every machine, not here)
  echo "== GPU tests"
  local t0=$SECONDS
  timeout 270 "$B/gpu_turbo" --include-ignored --test-threads=1 --nocapture >"$OUT/gpu_tests.txt" 2>&1
  local rc=$?
  grep -E "^test |test result|SKIPPED|panicked|differ in bits|vs golden" "$OUT/gpu_tests.txt" | tail -n 60
  [ $rc -eq 0 ] || { status=1; summary+=("GPU tests FAILED ($rc; see gpu_tests.txt)"); }
  if grep -q "SKIPPED " "$OUT/gpu_tests.txt"; then status=1; summary+=("a GPU test SKIPPED on the GPU machine"); fi
  summary+=("GPU tests: $(grep 'test result' "$OUT/gpu_tests.txt" | tail -n 1) in $((SECONDS - t0)) s")
  sanitize gpu_turbo gpu_turbo_sanitizer_small
}

run_bench() {
  echo "== correctness gate (bit-exact prefill and per-tile decode vs the emulation)"
  timeout 45 "$B/gpu_turbo" --include-ignored gpu_turbo_prefill_is_bit_exact_with_sas gpu_turbo_decode_steps_per_tile_match_the_emulation \
    --test-threads=2 >"$OUT/gate.txt" 2>&1
  local g=$?
  grep -E "test result|panicked" "$OUT/gate.txt"
  if [ $g -ne 0 ] || grep -q "SKIPPED " "$OUT/gate.txt"; then status=1; summary+=("correctness gate FAILED: no timing"); return; fi
  summary+=("correctness gate: $(grep 'test result' "$OUT/gate.txt")")
  echo "== all GPU tests"
  timeout 100 "$B/gpu_turbo" --include-ignored --test-threads=1 --nocapture >"$OUT/gpu_tests.txt" 2>&1
  local rc=$?
  grep -E "^test .*(ok|FAILED)$|test result|panicked|over all steps" "$OUT/gpu_tests.txt" | tail -n 30
  [ $rc -eq 0 ] || { status=1; summary+=("GPU tests FAILED ($rc; see gpu_tests.txt)"); }
  summary+=("GPU tests: $(grep 'test result' "$OUT/gpu_tests.txt" | tail -n 1)")
  echo "== TurboAttention benchmark"
  timeout 180 "$B/turbo" --out "$OUT/turbo.json" >"$OUT/bench_log.txt" 2>&1
  local bs=$?
  tail -n 40 "$OUT/bench_log.txt"
  [ $bs -eq 0 ] || { status=1; summary+=("bench FAILED ($bs)"); return; }
  echo "== PyTorch SDPA (same command)"
  PYTHONUNBUFFERED=1 timeout 140 python3 "$B/turbo_sdpa.py" "$OUT/turbo.json" "$OUT/sdpa.json" >"$OUT/table.md" 2>"$OUT/sdpa_log.txt"
  [ $? -eq 0 ] || { status=1; summary+=("SDPA FAILED"); tail -n 20 "$OUT/sdpa_log.txt"; }
}

case "$MODE" in
  tests) run_tests ;;
  bench) run_bench ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac

echo
echo "==================== summary ($FERRATTN_COMMIT, $(date -u +%F))"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/table.md" ] && cat "$OUT/table.md"
exit $status
