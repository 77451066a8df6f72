# Counts the loop of planes3_step.cu's SASS (cuobjdump -sass): the backward branch's loop with the
# most HMMA, per opcode and per pipe (the pipes as in ../turboquant-decode21-2026-11-27/sass/loop.py:
# ALU = PRMT, LOP3, SHF, IADD3, LEA, ...; IMAD on the FMA-heavy pipe). The loop has no forward
# branches (every instruction is on the path).
import re, sys, collections
PIPE = {'HMMA': 'tensor', 'FFMA': 'fma', 'FMUL': 'fma', 'FADD': 'fma', 'IMAD': 'fma (heavy)', 'HADD2': 'fma(h)',
        'FMNMX': 'alu', 'LOP3': 'alu', 'SHF': 'alu', 'PRMT': 'alu', 'IADD3': 'alu', 'ISETP': 'alu', 'FSETP': 'alu',
        'FSEL': 'alu', 'SEL': 'alu', 'LEA': 'alu', 'MOV': 'alu', 'VIADD': 'alu', 'PLOP3': 'alu', 'VOTE': 'alu',
        'MUFU': 'xu', 'F2FP': 'conv', 'LDS': 'lsu', 'BRA': 'br', 'NOP': 'nop'}
ins = []
for l in open(sys.argv[1]):
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m: ins.append((int(m.group(1), 16), m.group(2).strip()))
op = lambda s: re.sub(r'^@!?U?P[T0-9]+\s+', '', s).split()[0]
idx = {a: i for i, (a, _) in enumerate(ins)}
loops = []
for i, (a, s) in enumerate(ins):
    m = re.search(r'BRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)', s)
    if m and int(m.group(1), 16) < a: loops.append((idx[int(m.group(1), 16)], i))
lo, hi = max(loops, key=lambda l: sum(op(ins[j][1]).startswith('HMMA') for j in range(l[0], l[1] + 1)))
fwd = [j for j in range(lo, hi) if re.match(r'@!?P\d\s+BRA', ins[j][1])]
c, p = collections.Counter(), collections.Counter()
for j in range(lo, hi + 1):
    o = op(ins[j][1]); c[o] += 1; p[PIPE.get(o.split('.')[0], 'other:' + o.split('.')[0])] += 1
alu = p['alu']
print(f'{sys.argv[1]}: loop {hex(ins[lo][0])}-{hex(ins[hi][0])}, {hi - lo + 1} instructions '
      f'(forward branches inside: {len(fwd)}), ALU pipe {alu}, IMAD {c["IMAD"] + sum(v for k, v in c.items() if k.startswith("IMAD."))}')
print(' by pipe:', dict(p.most_common()))
print(' by opcode:', dict(c.most_common()))
