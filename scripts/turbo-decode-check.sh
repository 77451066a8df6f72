#!/usr/bin/env bash
# One device call for the TurboAttention decode work (issue 11): tests, sanitizers, the suite's
# TurboAttention rows before and after (SDPA in the same run), the decode instances side by side,
# and a sweep of the decode launch bounds through NVRTC. Runs from a folder holding bin.tar.xz
# (ferrattn, ferrattn-before, gpu_turbo, gpu_device_api, gpu_cp, unit_tests, turbo_decode) and
# this script; writes at most 8 files to $OUT.
#
# Usage: bash turbo-decode-check.sh [unit] [tests] [bench|after] [ab] [sweep]
#   (default: unit tests bench ab sweep; `after` times the suite with the new binary only)
set -uo pipefail
B="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$B/out}"
mkdir -p "$OUT"
cd "$B"
python3 -c "import tarfile; tarfile.open('bin.tar.xz').extractall('.')" || exit 1
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
for d in /usr/local/cuda/lib64 "$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)"; do
  if [ -n "$d" ] && ls "$d"/libnvrtc.so* >/dev/null 2>&1; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; break; fi
done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
echo "commit $(cat COMMIT), $(date -u +%FT%TZ)"
steps="${*:-unit tests bench ab sweep}"
t0=$SECONDS
for s in $steps; do
  case "$s" in
    unit)
      ./unit_tests --test-threads=8 >>"$OUT/tests.txt" 2>&1
      grep -E "^test result|FAILED|panicked" "$OUT/tests.txt"
      ;;
    tests)
      {
        ./gpu_turbo --include-ignored --test-threads=1 --nocapture
        ./gpu_device_api --include-ignored --test-threads=1 turbo
        ./gpu_cp --include-ignored --test-threads=1 turbo
      } >>"$OUT/tests.txt" 2>&1
      grep -E "^test result|FAILED|panicked|SKIPPED|differing O|vs golden over" "$OUT/tests.txt"
      for tool in memcheck racecheck; do
        FERRATTN_GPU_TEST_SCALE=small timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 9 \
          ./gpu_turbo gpu_turbo_sanitizer_small --exact --include-ignored --test-threads=1 >>"$OUT/sanitizer.txt" 2>&1
        echo "compute-sanitizer $tool rc=$?"
      done
      grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitizer.txt"
      ;;
    bench | after)
      vs="before after"
      [ "$s" = after ] && vs=after
      for v in $vs; do
        f=./ferrattn
        [ "$v" = before ] && f=./ferrattn-before
        timeout 200 "$f" bench --suite standard --algo turbo --backend cuda --out "/tmp/b-$v" >"/tmp/b-$v.md" 2>"$OUT/bench-$v.log"
        echo "bench $v rc=$? ($((SECONDS - t0)) s)"
        cp "/tmp/b-$v/bench.json" "$OUT/bench-$v.json"
      done
      ;;
    ab)
      ./turbo_decode ${AB_SHAPES:-1 16384 16 16384 32 32768} --bits "${AB_BITS:-int4,mixed}" >>"$OUT/decode.txt" 2>&1
      ;;
    sweep)
      for n in 3 5; do
        FERRATTN_NVRTC_DEFINES="-DFERRATTN_TURBO_DECODE_G4_BLOCKS=$n -DFERRATTN_TURBO_DECODE_BLOCKS=$((n - 1))" \
          timeout 120 ./turbo_decode 1 16384 16 16384 --bits int4 --nvrtc >>"$OUT/decode.txt" 2>&1
        echo "sweep g4 $n / full $((n - 1)): rc=$?" >>"$OUT/decode.txt"
      done
      timeout 120 ./turbo_decode 1 16384 16 16384 --bits int4 --nvrtc >>"$OUT/decode.txt" 2>&1
      echo "sweep defaults (g4 4 / full 3) through nvrtc: rc=$?" >>"$OUT/decode.txt"
      ;;
  esac
  echo "== $s done at $((SECONDS - t0)) s"
done
[ -f "$OUT/decode.txt" ] && cat "$OUT/decode.txt"
for v in before after; do
  [ -f "/tmp/b-$v.md" ] && { echo "---- $v"; grep -E "^\| [0-9].*(int4|mixed)" "/tmp/b-$v.md" | head -n 20; }
done
true
