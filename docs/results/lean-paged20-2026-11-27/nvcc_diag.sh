#!/bin/bash
# issue-9-paged20's NVCC for build.rs (after docs/results/turbo-prefill14-2026-11-27/nvcc_diag.sh): cuda-kernels/lean_decode.cu
# with $DIAG_DEFINES (-DFERRATTN_LEAN_STAMPS=1 for the stamps build), every other .cu copied from $REUSE_DIR (main's build).
# A change of DIAG_DEFINES alone does not rerun build.rs: touch cuda-kernels/lean_decode.cu.
# nvcc for build.rs: lean_decode.cu with $DIAG_DEFINES; other .cu files copied from $REUSE_DIR (main's build)
REAL=${NVCC_REAL:-nvcc}
src=""; out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; src="$a"; done
name=$(basename -- "$src" .cu)
if [[ "$name" == lean_decode ]]; then exec "$REAL" $DIAG_DEFINES "$@"; fi
if [[ -n "$REUSE_DIR" && -n "$out" && -f "$REUSE_DIR/$name.fatbin" && "$src" == *.cu ]]; then
  exec cp "$REUSE_DIR/$name.fatbin" "$out"
fi
exec "$REAL" "$@"
