#!/bin/sh
# Compiles planes3_step.cu for sm_90a once per layout and counts each loop (count.py).
# NVCC: the nvcc 13 wheel's (build.rs's); CUOBJDUMP: cuobjdump of the same toolkit.
set -e
cd "$(dirname "$0")"
# 0-4: the layouts; 5, 6: layouts 0 and 2 with the high-half selectors as IMAD.HI (-DHI_IMAD)
for v in 0 1 2 3 4 5 6; do
  case $v in 5) f="-DLAYOUT=0 -DHI_IMAD" ;; 6) f="-DLAYOUT=2 -DHI_IMAD" ;; *) f="-DLAYOUT=$v" ;; esac
  "$NVCC" -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 --cubin $f \
    -o /tmp/planes3_$v.cubin planes3_step.cu --resource-usage 2>&1 | grep -E "Used|spill"
  "$CUOBJDUMP" -sass /tmp/planes3_$v.cubin > /tmp/planes3_$v.sass
  python3 count.py /tmp/planes3_$v.sass
done
python3 - <<'PY'
# one line a layout: the loop's total and the opcodes that differ between layouts
import re, collections
names = ['NIB (main)', 'N3H', 'N3L', 'P21', 'SGN', 'NIB+HI', 'N3L+HI']
cols = ['PRMT', 'LOP3', 'SHF', 'LEA.HI', 'IMAD.HI', 'IMAD.MOV', 'IMAD.SHL', 'LDS', 'uniform', 'other']
print('layout      total  ALU-pipe  ' + '  '.join(cols))
for v, n in enumerate(names):
    ins = []
    for l in open(f'/tmp/planes3_{v}.sass'):
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
        if m: ins.append((int(m.group(1), 16), m.group(2).strip()))
    op = lambda s: re.sub(r'^@!?U?P[T0-9]+\s+', '', s).split()[0]
    idx = {a: i for i, (a, _) in enumerate(ins)}
    loops = [(idx[int(m.group(1), 16)], i) for i, (a, s) in enumerate(ins)
             for m in [re.search(r'BRA\s+(0x[0-9a-f]+)', s)] if m and int(m.group(1), 16) < a]
    lo, hi = max(loops, key=lambda l: sum(op(ins[j][1]).startswith('HMMA') for j in range(l[0], l[1] + 1)))
    c = collections.Counter()
    alu = 0
    for j in range(lo, hi + 1):
        o = op(ins[j][1])
        k = ('LEA.HI' if o.startswith('LEA.HI') else 'IMAD.HI' if o.startswith('IMAD.HI') else
             'IMAD.MOV' if o.startswith('IMAD.MOV') else 'IMAD.SHL' if o.startswith('IMAD.SHL') else
             'uniform' if o.startswith('U') else o.split('.')[0])
        c[k if k in cols else 'other'] += 1
        alu += o.split('.')[0] in ('PRMT', 'LOP3', 'SHF', 'LEA', 'IADD3', 'ISETP', 'FMNMX', 'SEL', 'FSEL', 'MOV', 'VIADD', 'PLOP3')
    print(f'{n:10s} {hi - lo + 1:6d} {alu:9d}  ' + '  '.join(f'{c[k]:{len(k)}d}' for k in cols))
PY
