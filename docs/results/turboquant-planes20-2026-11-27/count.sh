#!/bin/sh
# Compiles planes_step.cu three ways for sm_90a and counts each loop's typical path (count.py).
# NVCC: the nvcc 13 wheel's; CUOBJDUMP: cuobjdump from the same toolkit.
set -e
cd "$(dirname "$0")"
for v in imad alu tile; do
  f=""
  [ $v = alu ] && f=-DPLANE_SHIFT_ALU
  [ $v = tile ] && f=-DFOLD_TILE
  "$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --cubin -include cuda_fp16.h $f \
    -o /tmp/planes20_$v.cubin planes_step.cu --resource-usage 2>&1 | grep -E "Used|spill"
  "$CUOBJDUMP" -sass /tmp/planes20_$v.cubin > /tmp/planes20_$v.sass
  python3 count.py /tmp/planes20_$v.sass
done
