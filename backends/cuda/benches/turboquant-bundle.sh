#!/usr/bin/env bash
# Builds what the GPU machine runs for TurboQuant and gathers it into one folder (default
# ./.gpu-bundle-tq): the gpu_turboquant test binary, the turboquant bench and the ferrattn CLI (release,
# stripped, kernels embedded as a fatbin: nvcc from $NVCC or scripts/install-nvcc.sh),
# turboquant-gpu-run.sh as run.sh, turboquant_sdpa.py and COMMIT.
# Usage: bash backends/cuda/benches/turboquant-bundle.sh [DEST]
set -euo pipefail
cd "$(dirname "$0")/../../.."
DEST="${1:-$PWD/.gpu-bundle-tq}"
if [ -z "${NVCC:-}" ]; then
  NVCC="$(bash scripts/install-nvcc.sh | tail -n 1)"
  export NVCC
fi
msgs="$(mktemp)"
trap 'rm -f "$msgs"' EXIT
cargo test --release -p ferrattn-cuda --test gpu_turboquant --no-run --message-format=json >"$msgs"
cargo bench -p ferrattn-cuda --bench turboquant --no-run --message-format=json >>"$msgs"
cargo build --release -p ferrattn --bin ferrattn --message-format=json >>"$msgs"
rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "$msgs" "$DEST" <<'PY'
import json, shutil, sys
msgs, dest = sys.argv[1], sys.argv[2]
want = {("gpu_turboquant", "test"): "gpu_turboquant", ("turboquant", "bench"): "turboquant", ("ferrattn", "bin"): "ferrattn"}
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
    sys.exit(f"turboquant-bundle: no executable for {sorted(missing)}")
for name, exe in found.items():
    shutil.copy(exe, f"{dest}/{name}")
PY
strip "$DEST"/gpu_turboquant "$DEST"/turboquant "$DEST"/ferrattn
cp backends/cuda/benches/turboquant-gpu-run.sh "$DEST/run.sh"
cp backends/cuda/benches/turboquant_sdpa.py "$DEST/"
git rev-parse --short HEAD >"$DEST/COMMIT" 2>/dev/null || echo unknown >"$DEST/COMMIT"
git diff --quiet 2>/dev/null || echo "$(cat "$DEST/COMMIT")+dirty" >"$DEST/COMMIT"
du -sh "$DEST" >&2
