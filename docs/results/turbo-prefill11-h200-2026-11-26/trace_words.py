import struct,sys
from statistics import median
W=64
def load(p):
    raw=open(p,'rb').read(); n=len(raw)//(8*W)
    w=struct.unpack('<%dQ'%(n*W),raw[:n*W*8]); return [w[i*W:(i+1)*W] for i in range(n)]
for p in sys.argv[1:]:
    cs=[c for c in load(p) if c[0]]
    ghz=median([(c[4]-c[1])/(c[5]-c[0]) for c in cs])
    us=lambda x: x/ghz/1e3
    t0=min(c[0] for c in cs); t1=max(c[6] for c in cs)
    sms={}
    for c in cs: sms.setdefault(c[7]&0xffffffff,[]).append((c[0],c[6]))
    busy=sum((c[6]-c[0]) for c in cs)/1e3; span=(t1-t0)/1e3; tot=len(sms)*span
    gaps=0;tail=0
    for l in sms.values():
        l.sort(); tail+=(t1-l[-1][1])/1e3
        gaps+=sum((b[0]-a[1]) for a,b in zip(l,l[1:]))/1e3
    nts=[c[7]>>32 for c in cs]
    def m(f): 
        v=[f(c) for c in cs if (c[7]>>32)>0]; return median(v)
    print(p, f"span {span:.1f} us ghz {ghz:.3f} CTAs {len(cs)} busy {100*busy/tot:.1f}% gaps {100*gaps/tot:.2f}% tail {100*tail/tot:.2f}%")
    print(f"  entry->prod {m(lambda c: us(c[8]-c[1])):.3f} entry->Q(wg0) {m(lambda c: us(c[2]-c[1])):.3f} Q->tile0 S {m(lambda c: us(c[9]-c[2])):.3f} loop(wg0) {m(lambda c: us(c[3]-c[9])):.2f} loop->store {m(lambda c: us(c[4]-c[3])):.3f} CTA {m(lambda c:(c[6]-c[0])/1e3):.2f} store->last store {m(lambda c:(c[6]-c[5])/1e3):.3f}")
    # fit CTA time vs tiles
    xs=[(c[7]>>32,(c[6]-c[0])/1e3) for c in cs if (c[7]>>32)>0]
    n=len(xs); mx=sum(a for a,_ in xs)/n; my=sum(b for _,b in xs)/n; sxx=sum((a-mx)**2 for a,_ in xs)
    if sxx>0:
        b=sum((a-mx)*(y-my) for a,y in xs)/sxx; print(f"  fit CTA = {my-b*mx:.2f} + {b:.4f} x tiles")
    lp=[(c[7]>>32, us(c[3]-c[9])) for c in cs if (c[7]>>32)>0]
    n=len(lp); mx=sum(a for a,_ in lp)/n; my=sum(b for _,b in lp)/n; sxx=sum((a-mx)**2 for a,_ in lp)
    if sxx>0:
        b=sum((a-mx)*(y-my) for a,y in lp)/sxx; print(f"  fit loop(wg0) = {my-b*mx:.2f} + {b:.4f} x tiles")
