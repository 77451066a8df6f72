#!/usr/bin/env bash
# TurboQuant on the GPU machine, from a folder made by turboquant-bundle.sh (binaries
# gpu_turboquant, turboquant and ferrattn, turboquant_sdpa.py, COMMIT) with this script as run.sh.
#   bash <folder>/run.sh tests    # GPU tests, compute-sanitizer memcheck + racecheck
#   bash <folder>/run.sh bench    # benchmark (+ our Lean) and PyTorch SDPA in the same command
#   bash <folder>/run.sh all      # tests, the CLI on cuda, then bench
#   bash <folder>/run.sh quick    # tests, then the two-shape benchmark
# Logs and JSON go to $OUT (or <folder>/out); the summary and the table are printed last.
set -uo pipefail
MODE="${1:-all}"
# (self-contained: the preamble below was scripts/gpu-env.sh, which main has since folded into
# its single runner)
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT"
export FERRATTN_COMMIT="$(cat "$B/COMMIT" 2>/dev/null || echo unknown)"
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
status=0
summary=()
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    break
  fi
done

# sanitize BIN TEST: compute-sanitizer memcheck and racecheck on one test (small scale, 90 s each)
sanitize() {
  local tool s t0
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool ($2)"
    t0=$SECONDS
    FERRATTN_GPU_TEST_SCALE=small timeout 90 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$B/$1" "$2" --exact --include-ignored --test-threads=1 >"$OUT/sanitizer_$tool.txt" 2>&1
    s=$?
    tail -n 3 "$OUT/sanitizer_$tool.txt"
    if [ $s -ne 0 ]; then
      status=1
      summary+=("compute-sanitizer $tool: exit $s")
    else
      summary+=("compute-sanitizer $tool: $(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer_$tool.txt") ($((SECONDS - t0)) s)")
    fi
  done
}

gpu_tests() {
  local t0=$SECONDS
  timeout "$1" "$B/gpu_turboquant" --include-ignored --test-threads=1 --nocapture >"$OUT/gpu_tests.txt" 2>&1
  local rc=$?
  grep -E "^test .*(ok|FAILED)$|test result|panicked|SKIPPED" "$OUT/gpu_tests.txt" | tail -n 30
  [ $rc -eq 0 ] || { status=1; summary+=("GPU tests FAILED ($rc; see gpu_tests.txt)"); grep -m 12 -E "vs emulation|rel_fro|bit-exact|panicked" "$OUT/gpu_tests.txt"; }
  if grep -q "SKIPPED " "$OUT/gpu_tests.txt"; then status=1; summary+=("a GPU test SKIPPED on the GPU machine"); fi
  summary+=("GPU tests: $(grep 'test result' "$OUT/gpu_tests.txt" | tail -n 1) in $((SECONDS - t0)) s")
}

bench() {  # $1: extra flags
  local t0=$SECONDS
  timeout 150 "$B/turboquant" $1 --out "$OUT/turboquant.json" >"$OUT/bench_log.txt" 2>&1
  local bs=$?
  [ $bs -eq 0 ] || { status=1; summary+=("bench FAILED ($bs)"); tail -n 20 "$OUT/bench_log.txt"; return; }
  summary+=("bench: $((SECONDS - t0)) s")
  PYTHONUNBUFFERED=1 timeout 120 python3 "$B/turboquant_sdpa.py" "$OUT/turboquant.json" "$OUT/sdpa.json" >"$OUT/table.md" 2>"$OUT/sdpa_log.txt"
  [ $? -eq 0 ] || { status=1; summary+=("SDPA FAILED"); tail -n 20 "$OUT/sdpa_log.txt"; }
}

cli() {  # the facade on the GPU: run --algo turboquant and a turboquant-session
  [ -x "$B/ferrattn" ] || return 0
  timeout 60 "$B/ferrattn" run --algo turboquant --backend cuda --random 2,1,577,32,8,128 >"$OUT/cli.txt" 2>&1 \
    || { status=1; summary+=("ferrattn run --algo turboquant --backend cuda FAILED"); }
  timeout 90 "$B/ferrattn" turboquant-session --backend cuda --random 2,300,32,8,128 --steps 16 >>"$OUT/cli.txt" 2>&1 \
    || { status=1; summary+=("ferrattn turboquant-session --backend cuda FAILED"); }
  tail -n 12 "$OUT/cli.txt"
}

case "$MODE" in
  tests) gpu_tests 200; sanitize gpu_turboquant gpu_turboquant_sanitizer_small ;;
  bench) bench "" ;;
  all) gpu_tests 150; sanitize gpu_turboquant gpu_turboquant_sanitizer_small; cli; bench "" ;;
  quick) gpu_tests 100; sanitize gpu_turboquant gpu_turboquant_sanitizer_small; bench --quick ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac
echo
echo "==================== summary ($FERRATTN_COMMIT, $(date -u +%F))"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/table.md" ] && cat "$OUT/table.md"
exit $status
