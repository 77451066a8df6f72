#!/bin/bash
# decode19's build helper (after docs/results/turbo-prefill14-2026-11-27/nvcc_diag.sh): an nvcc for
# ferrattn-cuda's build.rs that compiles only the kernel files named in $RECOMPILE (space-separated
# basenames, e.g. "turboquant_decode") and copies every other <name>.fatbin from $REUSE_DIR (main's build
# of the same, unchanged source). Usage:
#   NVCC_REAL=/path/to/nvcc REUSE_DIR=/work/main/target/release/build/ferrattn-cuda-*/out \
#   RECOMPILE=turboquant_decode NVCC=$PWD/nvcc_reuse.sh cargo build --release -p ferrattn-cuda --bench ...
REAL=${NVCC_REAL:-nvcc}
src=""; out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; src="$a"; done
name=$(basename -- "$src" .cu)
for r in $RECOMPILE; do [[ "$name" == "$r" ]] && exec "$REAL" "$@"; done
if [[ -n "$REUSE_DIR" && -n "$out" && -f "$REUSE_DIR/$name.fatbin" && "$src" == *.cu ]]; then
  exec cp "$REUSE_DIR/$name.fatbin" "$out"
fi
exec "$REAL" "$@"
