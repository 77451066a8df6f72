import re,sys,collections
def parse(fn):
    ins=[]
    for l in open(fn):
        m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
        if m: ins.append((int(m.group(1),16),m.group(2).strip()))
    return ins
PIPE={'HMMA':'tensor','FFMA':'fma','FMUL':'fma','FADD':'fma','IMAD':'fma*','HADD2':'fma(h)','HMUL2':'fma(h)','HFMA2':'fma(h)',
 'FMNMX':'alu','LOP3':'alu','SHF':'alu','PRMT':'alu','IADD3':'alu','ISETP':'alu','FSETP':'alu','FSEL':'alu','SEL':'alu','LEA':'alu','MOV':'alu','IMNMX':'alu','VIADD':'alu','PLOP3':'alu','SGXT':'alu','FCHK':'alu',
 'MUFU':'xu','F2F':'conv','F2FP':'conv','I2F':'conv','F2I':'conv','I2FP':'conv',
 'LDS':'lsu','STS':'lsu','LDG':'lsu','STG':'lsu','LDGSTS':'lsu','SHFL':'lsu','LDC':'lsu/c','LDGDEPBAR':'lsu','DEPBAR':'sync','WARPSYNC':'sync','BAR':'sync','VOTE':'alu','BRA':'br','NOP':'nop','BSSY':'br','BSYNC':'br','S2R':'misc','CS2R':'misc','R2UR':'misc','S2UR':'misc','ULDC':'uniform','UMOV':'uniform','UIADD3':'uniform','ULOP3':'uniform','USHF':'uniform','ULEA':'uniform','UISETP':'uniform','ISETP':'alu','NANOSLEEP':'misc'}
def op(s):
    s=re.sub(r'^@!?U?P[T0-9]+\s+','',s)
    return s.split()[0]
ins=parse(sys.argv[1])
addr={a:i for i,(a,_) in enumerate(ins)}
loops=[]
for i,(a,s) in enumerate(ins):
    if 'BRA' in op(s):
        m=re.search(r'BRA\s+(?:`\(\.L_x_\d+\)\s*)?(0x[0-9a-f]+)',s)
        if not m: 
            m=re.search(r'(0x[0-9a-f]+)',s.split('BRA')[1])
        if m:
            t=int(m.group(1),16)
            if t<a and t in addr: loops.append((addr[t],i))
# pick loop with most HMMA
best=max(loops,key=lambda l:sum(1 for j in range(l[0],l[1]+1) if op(ins[j][1]).startswith('HMMA')))
lo,hi=best
c=collections.Counter(); p=collections.Counter()
for j in range(lo,hi+1):
    o=op(ins[j][1]); c[o]+=1; p[PIPE.get(o.split('.')[0],'other:'+o.split('.')[0])]+=1
print(sys.argv[1],'loop',hex(ins[lo][0]),hex(ins[hi][0]),'static',hi-lo+1)
print(' pipes',dict(p.most_common()))
print(' ops',dict(c.most_common()))
print('all loops:')
for lo,hi in sorted(loops):
    n=sum(1 for j in range(lo,hi+1) if op(ins[j][1]).startswith('HMMA'))
    print('  ',hex(ins[lo][0]),hex(ins[hi][0]),hi-lo+1,'HMMA',n)
