import re,sys,collections
exec(open('/tmp/d21/loop.py').read().split("ins=parse")[0])
CAT={'HMMA':'tensor(HMMA)','FFMA':'fp32','FMUL':'fp32','FADD':'fp32','FMNMX':'fp32-minmax','HADD2':'f16x2->f32 (HADD2.F32)','HMUL2':'f16x2','HFMA2':'f16x2',
 'IMAD':'IMAD (fma pipe)','LOP3':'LOP3','SHF':'SHF','PRMT':'PRMT','IADD3':'int add','VIADD':'int add','ISETP':'int cmp','FSETP':'fp cmp','FSEL':'select','SEL':'select','LEA':'int add',
 'MUFU':'MUFU(XU)','F2F':'conv','F2FP':'conv(F2FP pack)','I2F':'conv','F2I':'conv','LDS':'LDS','STS':'STS','LDGSTS':'LDGSTS(cp.async)','SHFL':'SHFL','LDGDEPBAR':'cp.async commit/wait','DEPBAR':'cp.async commit/wait',
 'WARPSYNC':'sync','BRA':'branch','VOTE':'vote','NOP':'nop','MOV':'mov','CS2R':'cs2r','UMOV':'uniform','ULDC':'uniform'}
def cat(o):
    b=o.split('.')[0]
    return CAT.get(b,'other:'+o)
def count(fn, regions):
    ins=parse(fn); c=collections.Counter(); n=0
    for a,s in ins:
        if any(lo<=a<=hi for lo,hi in regions):
            c[cat(op(s))]+=1; n+=1
    return n,c
fn=sys.argv[1]; regs=[tuple(int(x,16) for x in r.split('-')) for r in sys.argv[2:]]
n,c=count(fn,regs)
print(fn,'path instructions',n)
for k,v in sorted(c.items(),key=lambda x:-x[1]): print('   %-28s %d'%(k,v))
