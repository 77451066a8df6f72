#!/usr/bin/env bash
# CI of the Python binding (python/, import name `ferrattn`), called by .ci/run after the Rust
# tests: formatting and clippy of the binding crate (it is outside the cargo workspace), the abi3
# wheel built by maturin, installed into a fresh venv, and the pytest suite on the CPU with numpy
# only (torch tests say SKIPPED here; they run on the GPU machine, docs/GPU.md).
#
# The suite cross-checks the binding against the Rust CLI, which `cargo test --workspace` has
# already built (target/debug/ferrattn); it is built here if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
# the wheel's kernels come from NVRTC at run time on a GPU; CI has none, and the Rust step has
# already compiled every kernel with nvcc
export FERRATTN_NO_NVCC=1
VENV="${FERRATTN_PY_VENV:-target/py-venv}"
PY="${PYTHON:-python3}"

echo "== python: venv with maturin, numpy, pytest"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check maturin numpy pytest
"$VENV/bin/python" -c 'import sys, numpy; print("python", sys.version.split()[0], "numpy", numpy.__version__)'

echo "== python: binding formatting and clippy (warnings are errors)"
cargo fmt --manifest-path python/Cargo.toml -- --check
cargo clippy --manifest-path python/Cargo.toml --all-targets -- -D warnings

echo "== python: abi3 wheel"
rm -rf python/target/wheels
(cd python && "../$VENV/bin/maturin" build --release -o target/wheels)
WHEEL="$(ls python/target/wheels/ferrattn-*-abi3-*.whl)"
echo "built $WHEEL"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$WHEEL"

echo "== python: pytest"
[ -x target/debug/ferrattn ] || cargo build -p ferrattn-cli --bin ferrattn
export FERRATTN_CLI="$PWD/target/debug/ferrattn"
set +e
# from the repository root, so that `import ferrattn` is the installed wheel, not python/ferrattn
"$VENV/bin/python" -m pytest -p no:cacheprovider -ra -q python/tests
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: the Python suite must run (python/tests)" >&2
    exit 1
fi
exit "$rc"
