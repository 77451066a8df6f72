import re,sys
exec(open('/tmp/d21/loop.py').read().split("ins=parse")[0])
ins=parse(sys.argv[1])
addr={a:i for i,(a,_) in enumerate(ins)}
best=None
for i,(a,s) in enumerate(ins):
    o=op(s)
    if o=='BRA':
        m=re.search(r'(0x[0-9a-f]+)\s*$',s)
        if not m: continue
        t=int(m.group(1),16)
        if t<a:
            n=sum(1 for j in range(addr[t],i+1) if op(ins[j][1]).startswith('HMMA'))
            if n>=20 and (best is None or i-addr[t]<best[1]-best[0]): best=(addr[t],i)
lo,hi=best
print('loop',hex(ins[lo][0]),hex(ins[hi][0]),hi-lo+1)
seq=ins[lo:hi+1]
for i in range(0,len(seq),16):
    print(hex(seq[i][0]), ' '.join(('HMMA' if op(s).startswith('HMMA') else op(s).split('.')[0]) + ('*' if 'BRA' in s or 'VOTE' in s else '') for a,s in seq[i:i+16]))
