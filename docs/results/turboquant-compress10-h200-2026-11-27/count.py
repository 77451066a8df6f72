import re,sys,collections
# usage: count.py file.sass  -> per loop: total static instrs, minus rare blocks (f64 / LDS.U8 fallback), per row (/16)
lines=[l for l in open(sys.argv[1])]
ins=[]
for l in lines:
    m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2).strip()))
addr=[a for a,_ in ins]
targets=set()
for a,t in ins:
    m=re.search(r'BRA(?:\.\w+)*\s+(?:U?R\d+,\s*)?(0x[0-9a-f]+)',t)
    if m: targets.add(int(m.group(1),16))
# loops: backward branches to an address with WARPGROUP.ARRIVE nearby
loops=[]
for a,t in ins:
    m=re.search(r'BRA\s+(0x[0-9a-f]+)',t)
    if m:
        tg=int(m.group(1),16)
        if tg<a and any(x[0]>=tg and x[0]<=tg+0x100 and 'WARPGROUP.ARRIVE' in x[1] for x in ins):
            loops.append((tg,a))
# basic blocks within each loop
for lo,hi in loops:
    body=[(a,t) for a,t in ins if lo<=a<=hi]
    blocks=[];cur=[]
    for a,t in body:
        if a in targets and cur: blocks.append(cur);cur=[]
        cur.append((a,t))
        if 'BRA' in t or 'EXIT' in t: blocks.append(cur);cur=[]
    if cur: blocks.append(cur)
    rare=lambda b: any(re.match(r'(@!?U?P\w+\s+)?(D(ADD|FMA|MUL|SETP)|MUFU\.RSQ64|MUFU\.RCP64|F2F\.F64|F2F\.F32\.F64)',t) for _,t in b)
    lut=lambda b: any('LDS.U8' in t for _,t in b)
    tot=len(body)
    r=sum(len(b) for b in blocks if rare(b) and not lut(b))
    l=sum(len(b) for b in blocks if lut(b))
    kept=[t for b in blocks if not rare(b) and not (lut(b) and 'nolut' in sys.argv) for _,t in b]
    nop=sum(1 for t in kept if t.startswith('NOP'))
    ops=collections.Counter(re.sub(r'^@!?U?P\w+\s+','',t).split()[0].split('.')[0] for t in kept if not t.startswith('NOP'))
    n=len(kept)-nop
    print(f"loop {lo:#x}-{hi:#x}: static {tot}, rare(f64) {r}, lut-blocks {l}, counted {n} -> {n/16:.1f} per row; LDS {sum(v for k,v in ops.items() if k.startswith('LDS'))/16:.1f}/row")
    print("   ", ", ".join(f"{k} {v/16:.1f}" for k,v in ops.most_common(14)))
