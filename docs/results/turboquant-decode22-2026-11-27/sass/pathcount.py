import sys,re,collections
exec(open('/tmp/d21/auto.py').read().split("def loopinfo")[0])
PIPE={'PRMT':'alu','LOP3':'alu','SHF':'alu','int add':'alu','int cmp':'alu','fp cmp':'alu','select':'alu','fp32-minmax':'alu','vote':'alu','mov':'alu'}
def regions(fn, lo, hi):
    ins=parse(fn); L=[(a,s) for a,s in ins if lo<=a<=hi]
    br=[(a,s) for a,s in L if op(s)=='BRA' and 'DIV' not in s]
    X,T1=br[0][0],int(re.search(r'(0x[0-9a-f]+)\s*$',br[0][1]).group(1),16)
    J,T2=br[1][0],int(re.search(r'(0x[0-9a-f]+)\s*$',br[1][1]).group(1),16)
    V,T3=br[2][0],int(re.search(r'(0x[0-9a-f]+)\s*$',br[2][1]).group(1),16)
    fall=[(lo,X),(X+16,J),(T2,V),(T3,hi)]; taken=[(lo,X),(T1,T2-16),(T2,V),(T3,hi)]
    nf=sum(1 for a,s in ins if any(l<=a<=h for l,h in fall)); nt=sum(1 for a,s in ins if any(l<=a<=h for l,h in taken))
    return fall if nf<=nt else taken
def loops(fn):
    ins=parse(fn); addr={a:i for i,(a,_) in enumerate(ins)}; out=[]
    for i,(a,s) in enumerate(ins):
        if op(s)=='BRA' and 'DIV' not in s and s.startswith('@'):
            t=int(re.search(r'(0x[0-9a-f]+)\s*$',s).group(1),16)
            if t<a:
                n=sum(1 for j in range(addr[t],i+1) if op(ins[j][1]).startswith('HMMA'))
                if n>=16: out.append((t,a,i-addr[t]+1))
    return min(out,key=lambda x:x[2])
for fn in sys.argv[1:]:
    lo,hi,static=loops(fn)
    regs=regions(fn,lo,hi)
    n,c=count(fn,regs)
    alu=sum(v for k,v in c.items() if k in PIPE)
    f16=c['f16x2']; fp32=c['fp32']; imad=c['IMAD (fma pipe)']; hadd=c['f16x2->f32 (HADD2.F32)']
    print('%-28s loop %s-%s static %d path %d | HMMA %d PRMT %d LOP3 %d SHF %d ALU %d | f16x2 %d fp32 %d IMAD %d HADD2.F32 %d LDC %d | issue/tok %.2f ALU/tok %.2f' % (
      fn.split('/')[-1], hex(lo), hex(hi), static, n, c['tensor(HMMA)'], c['PRMT'], c['LOP3'], c['SHF'], alu, f16, fp32, imad, hadd, c['other:LDC.64']+c['other:LDC'], n/64, 2*alu/64))
    if '-v' in sys.argv[0:1]: print(c)
