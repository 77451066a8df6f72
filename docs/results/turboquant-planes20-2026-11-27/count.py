# Counts the typical path of the loop of planes_step.cu's SASS (cuobjdump -sass): the loop with the
# most IMMA, minus the blocks that conditional forward branches skip (the rescale), per opcode and
# pipe (ALU / FMA / tensor / ... as in ../turboquant-decode21-2026-11-27/sass/loop.py).
import re, sys, collections
PIPE = {'IMMA': 'tensor', 'HMMA': 'tensor', 'FFMA': 'fma', 'FMUL': 'fma', 'FADD': 'fma', 'IMAD': 'fma (heavy)',
        'HADD2': 'fma(h)', 'FMNMX': 'alu', 'LOP3': 'alu', 'SHF': 'alu', 'PRMT': 'alu', 'IADD3': 'alu', 'ISETP': 'alu',
        'FSETP': 'alu', 'FSEL': 'alu', 'SEL': 'alu', 'LEA': 'alu', 'MOV': 'alu', 'VIADD': 'alu', 'PLOP3': 'alu',
        'VOTE': 'alu', 'MUFU': 'xu', 'F2FP': 'conv', 'I2F': 'xu', 'F2I': 'xu', 'I2FP': 'conv', 'LDS': 'lsu',
        'SHFL': 'lsu', 'BRA': 'br', 'NOP': 'nop'}
ins = []
for l in open(sys.argv[1]):
    m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);', l)
    if m: ins.append((int(m.group(1), 16), m.group(2).strip()))
op = lambda s: re.sub(r'^@!?U?P[T0-9]+\s+', '', s).split()[0]
idx = {a: i for i, (a, _) in enumerate(ins)}
loops = []
for i, (a, s) in enumerate(ins):
    m = re.search(r'BRA\s+(0x[0-9a-f]+)', s)
    if m and int(m.group(1), 16) < a: loops.append((idx[int(m.group(1), 16)], i))
lo, hi = max(loops, key=lambda l: sum(op(ins[j][1]).startswith('IMMA') for j in range(l[0], l[1] + 1)))
skip = set()
blocks = []
for j in range(lo, hi):
    m = re.match(r'@!?P\d\s+BRA\s+(0x[0-9a-f]+)', ins[j][1])
    if m and int(m.group(1), 16) > ins[j][0]:
        blk = range(j + 1, idx[int(m.group(1), 16)])
        skip.update(blk)
        blocks.append(blk)
c, p = collections.Counter(), collections.Counter()
for j in range(lo, hi + 1):
    if j in skip: continue
    o = op(ins[j][1]); c[o] += 1; p[PIPE.get(o.split('.')[0], 'other:' + o.split('.')[0])] += 1
print(f'{sys.argv[1]}: loop {hex(ins[lo][0])}-{hex(ins[hi][0])}, static {hi - lo + 1}, typical path {sum(c.values())}')
print(' by pipe:', dict(p.most_common()))
print(' by opcode:', dict(c.most_common()))
for blk in blocks:
    c = collections.Counter(op(ins[j][1]).split('.')[0] for j in blk)
    print(f' skipped block {hex(ins[blk[0]][0])}-{hex(ins[blk[-1]][0])} ({len(blk)}):', dict(c.most_common()))
