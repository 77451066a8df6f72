#!/bin/bash
# Round 14's diagnostic builds (docs/TURBO_CUDA.md, "Prefill: the exact rescale's shifts ..."): an nvcc
# for ferrattn-cuda's build.rs that compiles cuda-kernels/turbo_prefill.cu with $DIAG_DEFINES (e.g.
# "-DFERRATTN_WGF_NO_SHIFT=1" or "-DFERRATTN_WGF_HEADROOM=1") and every other kernel file as given; with
# $REUSE_DIR set, a file whose <name>.fatbin lies there (main's build of the same, unchanged source) is
# copied instead of compiled (the two cores of the build machine are shared). Usage:
#   NVCC_REAL=/path/to/nvcc DIAG_DEFINES=-DFERRATTN_WGF_NO_SHIFT=1 NVCC=$PWD/nvcc_diag.sh \
#     cargo build --release -p ferrattn-cuda --bench turbo_prefill
# Timing only: the shipped kernels never define either flag.
REAL=${NVCC_REAL:-nvcc}
src=""; out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; src="$a"; done
name=$(basename -- "$src" .cu)
if [[ "$name" == turbo_prefill ]]; then exec "$REAL" $DIAG_DEFINES "$@"; fi
if [[ -n "$REUSE_DIR" && -n "$out" && -f "$REUSE_DIR/$name.fatbin" && "$src" == *.cu ]]; then
  exec cp "$REUSE_DIR/$name.fatbin" "$out"
fi
exec "$REAL" "$@"
