#!/usr/bin/env bash
# TurboAttention decode on the GPU machine, from a folder made by turbo-bundle.sh (binaries
# gpu_turbo and turbo, turbo_sdpa.py, COMMIT) with this script copied in as run-decode.sh.
#   bash <folder>/run-decode.sh check     # decode GPU tests, then the decode benchmark + SDPA
#   bash <folder>/run-decode.sh tests     # every GPU test, compute-sanitizer memcheck + racecheck
#   bash <folder>/run-decode.sh bench     # the decode benchmark + PyTorch SDPA in the same command
#   bash <folder>/run-decode.sh all       # tests, then bench
#   bash <folder>/run-decode.sh final     # tests, bench, the earlier build's bench, an ncu profile
# Logs and JSON go to $OUT (or <folder>/out); the summary and the table are printed last.
set -uo pipefail
MODE="${1:-check}"
# shellcheck source=/dev/null
source "$(cd "$(dirname "$0")" && pwd)/gpu-env.sh"

gpu_tests() {  # $1: test-name filter ("" for all), $2: timeout
  local t0=$SECONDS
  timeout "$2" "$B/gpu_turbo" $1 --include-ignored --test-threads=1 --nocapture >"$OUT/gpu_tests.txt" 2>&1
  local rc=$?
  grep -E "^test .*(ok|FAILED)$|test result|panicked|SKIPPED|over all steps|differing O|differ in bits" "$OUT/gpu_tests.txt" | tail -n 40
  [ $rc -eq 0 ] || { status=1; summary+=("GPU tests FAILED ($rc; see gpu_tests.txt)"); }
  if grep -q "SKIPPED " "$OUT/gpu_tests.txt"; then status=1; summary+=("a GPU test SKIPPED on the GPU machine"); fi
  summary+=("GPU tests '$1': $(grep 'test result' "$OUT/gpu_tests.txt" | tail -n 1) in $((SECONDS - t0)) s")
}

sanitizer() { sanitize gpu_turbo gpu_turbo_sanitizer_small; }

bench() {
  local t0=$SECONDS
  timeout 110 "$B/turbo" --decode-only --out "$OUT/turbo.json" >"$OUT/bench_log.txt" 2>&1
  local bs=$?
  tail -n 40 "$OUT/bench_log.txt"
  [ $bs -eq 0 ] || { status=1; summary+=("bench FAILED ($bs)"); return; }
  summary+=("bench: $((SECONDS - t0)) s")
  PYTHONUNBUFFERED=1 timeout 80 python3 "$B/turbo_sdpa.py" "$OUT/turbo.json" "$OUT/sdpa.json" >"$OUT/table.md" 2>"$OUT/sdpa_log.txt"
  [ $? -eq 0 ] || { status=1; summary+=("SDPA FAILED"); tail -n 20 "$OUT/sdpa_log.txt"; }
}

# the same benchmark from an earlier build in <folder>/old (if present), for a before/after in
# one command
bench_old() {
  [ -x "$B/old/turbo" ] || return 0
  timeout 60 "$B/old/turbo" --decode-only --out "$OUT/turbo_old.json" >"$OUT/bench_old_log.txt" 2>&1
  echo "== earlier build ($(cat "$B/old/COMMIT" 2>/dev/null))"
  grep -E "^ +[0-9]+ x" "$OUT/bench_old_log.txt"
}

# Nsight Compute on one decode launch (32 x 32k), when the machine has ncu
profile() {
  local ncu
  ncu="$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)"
  [ -n "$ncu" ] || { summary+=("ncu: not on this machine"); return 0; }
  for bits in int4 mixed; do
    timeout 45 "$ncu" -k regex:turbo_decode_bf16_d128 -s 3 -c 1 --section SpeedOfLight --section Occupancy \
      --section SchedulerStats --section WarpStateStats --section InstructionStats \
      "$B/turbo" --decode-only --shape 32,32768 --bits $bits --out /tmp/ncu_$bits.json >"$OUT/ncu_$bits.txt" 2>&1
    summary+=("ncu $bits: exit $?")
    grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Executed Ipc A|Stall|stall" "$OUT/ncu_$bits.txt" | head -n 30
  done
}

case "$MODE" in
  check) gpu_tests "decode run_turbo sanitizer_small" 100; bench ;;
  tests) gpu_tests "" 150; sanitizer ;;
  all) gpu_tests "" 110; sanitizer; bench ;;
  final) gpu_tests "" 100; sanitizer; bench; bench_old; profile ;;
  bench) bench ;;
  *) echo "unknown mode $MODE"; exit 2 ;;
esac
echo
echo "==================== summary ($FERRATTN_COMMIT, $(date -u +%F))"
printf '%s\n' "${summary[@]}"
[ -f "$OUT/table.md" ] && cat "$OUT/table.md"
exit $status
