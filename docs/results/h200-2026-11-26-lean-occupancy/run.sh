#!/bin/bash
B=$(cd "$(dirname "$0")" && pwd); cd "$B"; export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
export FERRATTN_CACHE_DIR=/tmp/ferrattn-cache
nvidia-smi --query-gpu=name --format=csv,noheader
for v in base occ base occ; do
  if [ $v = occ ]; then D="-DFERRATTN_LEAN_STAGES=2 -DFERRATTN_LEAN_MIN_CTAS=3"; else D=""; fi
  t0=$SECONDS; echo "== $v"; FERRATTN_NVRTC_DEFINES="$D" timeout 200 ./lean_grid --nvrtc --names lean,llama 2>&1 | grep -E '^(lean|llama)' | cut -c1-160; echo "($((SECONDS-t0)) s)"
done | tee $OUT/occ.txt
