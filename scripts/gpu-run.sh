#!/usr/bin/env bash
# Runs on the GPU machine from a folder made by scripts/gpu-bundle.sh (copied there as run.sh):
#   bash <bundle>/run.sh tests            # unit + every GPU test binary, compute-sanitizer
#   bash <bundle>/run.sh quick|standard|full   # ferrattn bench --suite ...
#   bash <bundle>/run.sh bench SUITE...   # several suites in one call ($BENCH_TIMEOUT s each)
#   bash <bundle>/run.sh check SUITE...   # tests, then each suite
# Each suite's bench.json goes to $OUT/bench-<suite>.json (the report and plots are made from it
# where the docs are written: `ferrattn bench --from bench-<suite>.json`); logs to $OUT. At most 8
# files come back from the device tool: tests.txt, sanitizer.txt, bench-*.json, bench-*.log.
# Exits non-zero when a test fails, a GPU test printed SKIPPED, a sanitizer reports an error, or a
# bench row failed its check or could not run.
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT"
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
status=0
summary=()
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1
# libnvrtc for the NVRTC-path tests
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  "$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)"; do
  if [ -n "$d" ] && ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    break
  fi
done

run_tests() {
  local t0=$SECONDS rc
  echo "== unit tests"
  "$B/unit_tests" >>"$OUT/tests.txt" 2>&1 || { status=1; summary+=("unit tests FAILED"); }
  for t in "$B"/gpu_*; do
    echo "== $(basename "$t")"
    timeout "${TEST_TIMEOUT:-300}" "$t" --include-ignored --test-threads=1 --nocapture >"/tmp/$(basename "$t").txt" 2>&1
    rc=$?
    cat "/tmp/$(basename "$t").txt" >>"$OUT/tests.txt"
    grep -E "^test .*(ok|FAILED)$|test result|panicked|SKIPPED" "/tmp/$(basename "$t").txt" | tail -n 30
    [ $rc -eq 0 ] || { status=1; summary+=("$(basename "$t") FAILED ($rc)"); }
    if grep -q "SKIPPED " "/tmp/$(basename "$t").txt"; then status=1; summary+=("$(basename "$t"): a GPU test SKIPPED on the GPU machine"); fi
    summary+=("$(basename "$t"): $(grep 'test result' "/tmp/$(basename "$t").txt" | tail -n 1)")
  done
  for pair in "gpu_lean gpu_sanitizer_small_grid" "gpu_turbo gpu_turbo_sanitizer_small" "gpu_lean lean_device::gpu_device_sanitizer_small" "gpu_turboquant gpu_turboquant_sanitizer_small" "gpu_turboquant gpu_turboquant_fast_sanitizer_small"; do
    set -- $pair
    for tool in memcheck racecheck; do
      FERRATTN_GPU_TEST_SCALE=small timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
        "$B/$1" "$2" --exact --include-ignored --test-threads=1 >/tmp/san.txt 2>&1
      rc=$?
      cat /tmp/san.txt >>"$OUT/sanitizer.txt"
      if [ $rc -ne 0 ]; then status=1; summary+=("compute-sanitizer $tool $2: exit $rc"); else
        summary+=("compute-sanitizer $tool $2: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/san.txt)"); fi
    done
  done
  summary+=("tests: $((SECONDS - t0)) s")
}

run_bench() {
  local suite="$1" t0=$SECONDS rc
  echo "== ferrattn bench --suite $suite"
  timeout "${BENCH_TIMEOUT:-560}" "$B/ferrattn" bench --suite "$suite" --out "/tmp/bench-$suite" >"/tmp/bench-$suite.md" 2>"$OUT/bench-$suite.log"
  rc=$?
  cp "/tmp/bench-$suite/bench.json" "$OUT/bench-$suite.json" 2>/dev/null
  tail -n 5 "$OUT/bench-$suite.log"
  [ $rc -eq 0 ] || { status=1; summary+=("bench $suite FAILED ($rc): $(tail -n 1 "$OUT/bench-$suite.log")"); }
  summary+=("bench $suite: $((SECONDS - t0)) s, $(grep -c '^|' "/tmp/bench-$suite.md") table lines")
}

MODE="${1:-quick}"
shift || true
case "$MODE" in
  tests) run_tests ;;
  quick|standard|full) run_bench "$MODE" ;;
  bench) for s in "$@"; do run_bench "$s"; done ;;
  check) run_tests; for s in "$@"; do run_bench "$s"; done ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac

echo
echo "==================== summary ($(cat "$B/COMMIT" 2>/dev/null), $(date -u +%F))"
printf '%s\n' "${summary[@]}"
for s in quick standard full; do
  [ -f "/tmp/bench-$s.md" ] && { echo "---- $s"; grep -E "^(\`|###|\*\*)|vs best|^\| [0-9]" "/tmp/bench-$s.md" | head -n 40; }
done
exit $status
