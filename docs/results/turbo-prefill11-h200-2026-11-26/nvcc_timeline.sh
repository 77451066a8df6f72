#!/bin/bash
# The instrumented build of round 11's per-CTA timeline (docs/TURBO_CUDA.md, "Prefill: a per-CTA
# timeline ..."): an nvcc for ferrattn-cuda's build.rs that compiles cuda-kernels/turbo_prefill.cu
# with -DFERRATTN_WGF_TIMELINE=1 and every other kernel file as given. Usage:
#   NVCC_REAL=/path/to/nvcc NVCC=$PWD/docs/results/turbo-prefill11-h200-2026-11-26/nvcc_timeline.sh \
#     cargo build --release -p ferrattn-cuda --bench turbo_prefill
# then run `FERRATTN_WGF_TRACE=1 turbo_prefill ... --only fast --trace DIR` and timeline.py on DIR.
# (Changing NVCC reruns build.rs; build again with the plain nvcc afterwards for shipped kernels.)
REAL=${NVCC_REAL:-nvcc}
src=""
for a in "$@"; do src="$a"; done
if [[ "$(basename -- "$src")" == turbo_prefill.cu ]]; then exec "$REAL" -DFERRATTN_WGF_TIMELINE=1 "$@"; fi
exec "$REAL" "$@"
