#!/bin/bash
# issue-9-paged21's NVCC for build.rs (after lean-paged20's): cuda-kernels/lean_decode.cu compiled with $DIAG_DEFINES
# (-DFERRATTN_LEAN_STAMPS=1 for the stamps build), or copied from $LEAN_FATBIN when set (a fatbin built by hand with the
# build's flags); every other .cu copied from $REUSE_DIR (a finished build of main's kernels).
# A change of DIAG_DEFINES / LEAN_FATBIN alone does not rerun build.rs: touch cuda-kernels/lean_decode.cu.
REAL=${NVCC_REAL:-nvcc}
src=""; out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; src="$a"; done
name=$(basename -- "$src" .cu)
if [[ "$name" == lean_decode ]]; then
  if [[ -n "$LEAN_FATBIN" && -n "$out" ]]; then exec cp "$LEAN_FATBIN" "$out"; fi
  exec "$REAL" $DIAG_DEFINES "$@"
fi
if [[ -n "$REUSE_DIR" && -n "$out" && -f "$REUSE_DIR/$name.fatbin" && "$src" == *.cu ]]; then
  exec cp "$REUSE_DIR/$name.fatbin" "$out"
fi
exec "$REAL" "$@"
