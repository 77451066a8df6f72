import struct,sys
from statistics import median
W=64
def load(p):
    raw=open(p,'rb').read(); n=len(raw)//(8*W)
    w=struct.unpack('<%dQ'%(n*W),raw[:n*W*8]); return [w[i*W:(i+1)*W] for i in range(n)]
for p in sys.argv[1:]:
    cs=[c for c in load(p) if c[0]]
    ghz=median([(c[4]-c[1])/(c[5]-c[0]) for c in cs]); us=lambda x: x/ghz/1e3
    late=[]; spread={k:[] for k in range(8)}; endspread=[]; seg={k:[] for k in range(7)}
    for c in cs:
        for w in range(3):
            nt=c[50+w]
            if nt>64 and c[19+8*w+7]: late.append(us(c[43+w]-c[19+8*w+7])/(nt-56))
            if nt>=57:
                for k in range(7): seg[k].append(us(c[19+8*w+k+1]-c[19+8*w+k])/8)
        if all(c[50+w]>=57 for w in range(3)):
            for k in range(8):
                v=[c[19+8*w+k] for w in range(3)]; spread[k].append(us(max(v)-min(v)))
            v=[c[43+w] for w in range(3)]; endspread.append(us(max(v)-min(v)))
    print(p)
    if late: print(f"  per tile after tile 56: {median(late):.4f} us")
    print("  per tile by segment of 8 (tiles 0-8, 8-16, ...):", " ".join(f"{median(seg[k]):.3f}" for k in range(7) if seg[k]))
    print("  spread of the 3 warpgroups' step start (max-min, us) at tiles 0,8,..56:", " ".join(f"{median(spread[k]):.3f}" for k in range(8) if spread[k]), f"; at loop end {median(endspread):.3f}" if endspread else "")
    # per-CTA wall from globaltimer: first S -> (cta) etc
    pro=[us(min(c[13+w] for w in range(3) if c[50+w])-c[1]) for c in cs if any(c[50+w] for w in range(3))]
    print(f"  entry stamp -> first warpgroup's tile 0 S issued: {median(pro):.3f} us")
