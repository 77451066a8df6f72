#!/bin/bash
# nvcc_reuse.sh with -DFERRATTN_LEAN_L2PF=${PF:-1} added first (nvcc_reuse.sh takes the last argument as the source)
exec /work/tmp22/nvcc_reuse.sh -DFERRATTN_LEAN_L2PF=${PF:-1} "$@"
