#!/usr/bin/env bash
# Installs a pinned CUDA 13.0 nvcc from PyPI wheels into ./.venv-nvcc and prints the path of nvcc
# on its last line of stdout. Idempotent: a second run only verifies and prints.
#
# Pins verified on 2026-11-22 to build an sm_90a fatbin on this (GPU-less) machine:
#   nvidia-cuda-nvcc 13.0.88, nvidia-cuda-crt 13.0.88, nvidia-nvvm 13.0.88,
#   nvidia-cuda-runtime 13.0.96, nvidia-cuda-cccl 13.0.85; plus nvidia-cuda-nvrtc 13.0.88 so that
# the NVRTC path is tested too (export LD_LIBRARY_PATH="$(dirname "$NVCC")/../lib").
# The wheels put everything under site-packages/nvidia/cu13/{bin,include,nvvm,lib}; the nvcc.profile
# beside nvcc points at cicc (nvvm/bin) and the headers relative to itself, so no -I is needed.
# Usage: bash scripts/install-nvcc.sh    (then NVCC=<printed path> cargo build)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FERRATTN_NVCC_VENV:-$PWD/.venv-nvcc}"
PY="${PYTHON:-python3}"
pins=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cuda-nvrtc==13.0.88
)
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${pins[@]}" >&2
root="$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
nvcc="$root/bin/nvcc"
if [ ! -x "$nvcc" ]; then
  echo "install-nvcc: $nvcc is missing after install; wheel layout changed?" >&2
  exit 1
fi
# Smoke test: compile one tiny kernel for sm_90a so a broken toolkit fails here, not in build.rs.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/t.cu" <<'CU'
#include <cuda_fp16.h>
extern "C" __global__ void k(__half* x) { x[threadIdx.x] = __float2half(1.0f); }
CU
"$nvcc" -fatbin -gencode=arch=compute_90a,code=sm_90a -I"$root/include" -o "$tmp/t.fatbin" "$tmp/t.cu" >&2
"$nvcc" --version | tail -n 2 >&2
echo "$nvcc"
