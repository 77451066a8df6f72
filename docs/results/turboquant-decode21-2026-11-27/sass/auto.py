import re,sys,collections
exec(open('/tmp/d21/path.py').read().split("fn=sys.argv[1]")[0])
def loopinfo(fn):
    ins=parse(fn); addr={a:i for i,(a,_) in enumerate(ins)}
    best=None
    for i,(a,s) in enumerate(ins):
        if op(s)=='BRA':
            m=re.search(r'(0x[0-9a-f]+)\s*$',s)
            if not m: continue
            t=int(m.group(1),16)
            if t<a:
                n=sum(1 for j in range(addr[t],i+1) if op(ins[j][1]).startswith('HMMA'))
                if n>=16 and (best is None or i-addr[t]<best[1]-best[0]): best=(addr[t],i)
    lo,hi=best; L=ins[lo:hi+1]
    br=[(a,s) for a,s in L if op(s)=='BRA' and 'DIV' not in s]
    # br: [softmax cond, jump-over, vote cond, loop back]
    X,T1=br[0][0],int(re.search(r'(0x[0-9a-f]+)\s*$',br[0][1]).group(1),16)
    J,T2=br[1][0],int(re.search(r'(0x[0-9a-f]+)\s*$',br[1][1]).group(1),16)
    V,T3=br[2][0],int(re.search(r'(0x[0-9a-f]+)\s*$',br[2][1]).group(1),16)
    a0,a1=L[0][0],L[-1][0]
    fall=[(a0,X),(X+16,J),(T2,V),(T3,a1)]
    taken=[(a0,X),(T1,T2-16),(T2,V),(T3,a1)]
    nf=sum(1 for a,s in ins if any(l<=a<=h for l,h in fall)); nt=sum(1 for a,s in ins if any(l<=a<=h for l,h in taken))
    return (fall if nf<=nt else taken), hi-lo+1
for fn in sys.argv[1:]:
    regs,static=loopinfo(fn)
    n,c=count(fn,regs)
    alu=sum(v for k,v in c.items() if k in ('PRMT','LOP3','SHF','int add','int cmp','fp cmp','select','fp32-minmax','vote','mov'))
    print('%-24s static %d path %d  HMMA %d PRMT %d LOP3 %d SHF %d ALU %d fp32 %d IMAD %d HADD2.F32 %d LDS %d MUFU %d' % (fn, static, n, c['tensor(HMMA)'], c['PRMT'], c['LOP3'], c['SHF'], alu, c['fp32'], c['IMAD (fma pipe)'], c['f16x2->f32 (HADD2.F32)'], c['LDS'], c['MUFU(XU)']))
