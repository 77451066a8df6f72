#!/bin/bash
REAL=/work/main/.venv-nvcc/lib/python3.11/site-packages/nvidia/cu13/bin/nvcc
args=(); src=""; out=""; prev=""
for a in "$@"; do [[ "$prev" == "-o" ]] && out="$a"; prev="$a"; src="$a"; done
name=$(basename -- "$src" .cu)
if [[ "$name" == turbo_prefill ]]; then
  for a in "$@"; do [[ "$a" == "$src" ]] && a=/work/main/cuda-kernels/turbo_prefill.cu; args+=("$a"); done
  exec "$REAL" -DFERRATTN_WGF_TIMELINE=1  "${args[@]}"
fi
R=/work/main/target/release/build/ferrattn-cuda-461ebf5a70c694ca/out
if [[ -n "$out" && -f "$R/$name.fatbin" && "$src" == *.cu ]]; then exec cp "$R/$name.fatbin" "$out"; fi
exec "$REAL" "$@"
