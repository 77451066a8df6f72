#!/usr/bin/env bash
# Builds everything the GPU machine runs and gathers it into one folder (default ./.gpu-bundle):
# the ferrattn-cuda GPU test binary and unit-test binary (cargo test --release --no-run), the
# Lean benchmark binary, scripts/gpu-run.sh as run.sh, the SDPA baseline and the report script.
# Binaries are x86-64, stripped (the device tool carries at most 64 MiB), with the kernels
# embedded as a fatbin (nvcc from $NVCC or scripts/install-nvcc.sh).
#
# Usage: bash scripts/gpu-bundle.sh [DEST]
# Then (from the lead's checkout the device tool sends):
#   rm -rf /work/main/.gpu-bundle && cp -r .gpu-bundle /work/main/.gpu-bundle
#   run(command="bash .gpu-bundle/run.sh full", carry=[".gpu-bundle"])
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-$PWD/.gpu-bundle}"
if [ -z "${NVCC:-}" ]; then
  NVCC="$(bash scripts/install-nvcc.sh | tail -n 1)"
  export NVCC
fi
echo "nvcc: $NVCC" >&2
msgs="$(mktemp)"
trap 'rm -f "$msgs"' EXIT
cargo test --release -p ferrattn-cuda --no-run --message-format=json >"$msgs"
cargo bench -p ferrattn-cuda --bench lean_decode --bench lean_paged --no-run --message-format=json >>"$msgs"
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$msgs" "$DEST" <<'PY'
import json, shutil, sys
msgs, dest = sys.argv[1], sys.argv[2]
want = {("gpu_lean", "test"): "gpu_lean", ("ferrattn_cuda", "lib"): "unit_tests", ("lean_decode", "bench"): "lean_decode",
        ("gpu_lean_device", "test"): "gpu_lean_device", ("lean_paged", "bench"): "lean_paged"}
found = {}
for line in open(msgs):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    for kind in t["kind"]:
        name = want.get((t["name"].replace("-", "_"), kind))
        if name:
            found[name] = m["executable"]
missing = set(want.values()) - set(found)
if missing:
    sys.exit(f"gpu-bundle: no executable for {sorted(missing)}")
for name, exe in found.items():
    shutil.copy(exe, f"{dest}/{name}")
PY
strip "$DEST"/gpu_lean "$DEST"/unit_tests "$DEST"/lean_decode "$DEST"/gpu_lean_device "$DEST"/lean_paged
cp scripts/gpu-run.sh "$DEST/run.sh"
cp scripts/gpu-run-device.sh "$DEST/run-device.sh"
cp scripts/gpu-env.sh "$DEST/"
cp scripts/sdpa_bench.py scripts/gpu-report.py "$DEST/"
git rev-parse --short HEAD >"$DEST/COMMIT" 2>/dev/null || echo unknown >"$DEST/COMMIT"
git diff --quiet 2>/dev/null || echo "$(cat "$DEST/COMMIT")+dirty" >"$DEST/COMMIT"
du -sh "$DEST" >&2
ls -la "$DEST" >&2
