#!/usr/bin/env bash
# Builds what the GPU machine runs for TurboAttention and gathers it into one folder (default
# ./.gpu-bundle-turbo): the gpu_turbo test binary, the ferrattn-cuda unit-test binary and the
# turbo bench (release, stripped, kernels embedded as a fatbin: nvcc from $NVCC or
# scripts/install-nvcc.sh), turbo-gpu-run.sh as run.sh, turbo-decode-gpu-run.sh as run-decode.sh,
# turbo_sdpa.py and COMMIT.
# Usage: bash backends/cuda/benches/turbo-bundle.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/../../.."
DEST="${1:-$PWD/.gpu-bundle-turbo}"
if [ -z "${NVCC:-}" ]; then
  NVCC="$(bash scripts/install-nvcc.sh | tail -n 1)"
  export NVCC
fi
msgs="$(mktemp)"
trap 'rm -f "$msgs"' EXIT
cargo test --release -p ferrattn-cuda --no-run --message-format=json >"$msgs"
cargo bench -p ferrattn-cuda --bench turbo --no-run --message-format=json >>"$msgs"
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$msgs" "$DEST" <<'PY'
import json, shutil, sys
msgs, dest = sys.argv[1], sys.argv[2]
want = {("gpu_turbo", "test"): "gpu_turbo", ("ferrattn_cuda", "lib"): "unit_tests", ("turbo", "bench"): "turbo"}
found = {}
for line in open(msgs):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    for kind in m["target"]["kind"]:
        name = want.get((m["target"]["name"].replace("-", "_"), kind))
        if name:
            found[name] = m["executable"]
missing = set(want.values()) - set(found)
if missing:
    sys.exit(f"turbo-bundle: no executable for {sorted(missing)}")
for name, exe in found.items():
    shutil.copy(exe, f"{dest}/{name}")
PY
strip "$DEST"/gpu_turbo "$DEST"/unit_tests "$DEST"/turbo
cp backends/cuda/benches/turbo-gpu-run.sh "$DEST/run.sh"
cp scripts/gpu-env.sh "$DEST/"
cp backends/cuda/benches/turbo-decode-gpu-run.sh "$DEST/run-decode.sh"
cp backends/cuda/benches/turbo_sdpa.py "$DEST/"
git rev-parse --short HEAD >"$DEST/COMMIT" 2>/dev/null || echo unknown >"$DEST/COMMIT"
git diff --quiet 2>/dev/null || echo "$(cat "$DEST/COMMIT")+dirty" >"$DEST/COMMIT"
du -sh "$DEST" >&2
