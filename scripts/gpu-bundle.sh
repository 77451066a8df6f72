#!/usr/bin/env bash
# Builds everything the GPU machine runs into one folder (default ./.gpu-bundle): the release
# `ferrattn` binary (its `bench` command is the benchmark suite, PyTorch script included), the
# ferrattn-cuda GPU test binaries (every tests/gpu_*.rs) and unit-test binary, the facade's
# tests/gpu_device_api.rs (the device path through the public API), scripts/gpu-run.sh
# as run.sh, and COMMIT. Binaries are x86-64 and stripped (the device tool carries at most
# 64 MiB), kernels embedded as a fatbin (nvcc from $NVCC or scripts/install-nvcc.sh).
#
# Usage: bash scripts/gpu-bundle.sh [DEST]
# Then, from the checkout the device tool sends (the lead's):
#   rm -rf /work/main/.gpu-bundle && cp -r .gpu-bundle /work/main/.gpu-bundle
#   run(command="bash .gpu-bundle/run.sh quick", carry=[".gpu-bundle"])
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
cargo build --release -p ferrattn-cli --bin ferrattn --message-format=json >"$msgs"
cargo test --release -p ferrattn-cuda --no-run --message-format=json >>"$msgs"
cargo test --release -p ferrattn --test gpu_device_api --no-run --message-format=json >>"$msgs"
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$msgs" "$DEST" <<'PY'
import json, shutil, sys
msgs, dest = sys.argv[1], sys.argv[2]
found = {}
for line in open(msgs):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    name = t["name"].replace("-", "_")
    if ("bin" in t["kind"] and name == "ferrattn") or ("test" in t["kind"] and name.startswith("gpu_")):
        found[name] = m["executable"]
    elif "lib" in t["kind"] and name == "ferrattn_cuda":
        found["unit_tests"] = m["executable"]
for need in ("ferrattn", "unit_tests", "gpu_lean", "gpu_turbo"):
    if need not in found:
        sys.exit(f"gpu-bundle: no executable for {need}")
for name, exe in found.items():
    shutil.copy(exe, f"{dest}/{name}")
PY
strip "$DEST"/ferrattn "$DEST"/unit_tests "$DEST"/gpu_*
cp scripts/gpu-run.sh "$DEST/run.sh"
git rev-parse --short=12 HEAD >"$DEST/COMMIT" 2>/dev/null || echo unknown >"$DEST/COMMIT"
git diff --quiet HEAD 2>/dev/null || echo "$(cat "$DEST/COMMIT")+dirty" >"$DEST/COMMIT"
du -sh "$DEST" >&2
ls -la "$DEST" >&2
