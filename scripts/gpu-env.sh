# Sourced (not run) by the GPU-machine runners (scripts/gpu-run.sh, backends/cuda/benches/
# turbo-gpu-run.sh, turbo-decode-gpu-run.sh) from the bundle folder they are copied into.
# Sets B (the bundle folder), OUT (logs; $OUT or <bundle>/out), FERRATTN_COMMIT (from COMMIT),
# FERRATTN_CACHE_DIR, status=0 and an empty summary array; prints the GPU; puts libnvrtc on
# LD_LIBRARY_PATH for the NVRTC-path tests; defines sanitize.
B="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT"
export FERRATTN_COMMIT="$(cat "$B/COMMIT" 2>/dev/null || echo unknown)"
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
status=0
summary=()
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  "$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)"; do
  if [ -n "$d" ] && ls "$d"/libnvrtc.so* >/dev/null 2>&1; then
    export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    echo "libnvrtc from $d"
    break
  fi
done

# sanitize BIN TEST: compute-sanitizer memcheck and racecheck on one test of a bundled test
# binary (small scale, 90 s each); logs in $OUT/sanitizer_<tool>.txt, result in the summary.
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
