import re,sys,collections,subprocess
CU='/tmp/vt/lib/python3.11/site-packages/nvidia/cu13/bin/cuobjdump'
def ins(cubin,fn):
    out=subprocess.run([CU,'-sass','-fun',fn,cubin],capture_output=True,text=True).stdout
    r=[]
    for l in out.splitlines():
        m=re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)([.A-Z0-9_]*)\s*(.*?);',l)
        if m: r.append((int(m.group(1),16),m.group(3),m.group(5)))
    return r
def loop(cubin,fn):
    I=ins(cubin,fn)
    # back edge: a BRA to a lower address that is the largest span
    best=None
    for a,op,arg in I:
        if op=='BRA':
            t=re.search(r'0x([0-9a-f]+)',arg)
            if t and int(t.group(1),16)<a:
                span=a-int(t.group(1),16)
                if best is None or span>best[0]: best=(span,int(t.group(1),16),a)
    _,lo,hi=best
    body=[x for x in I if lo<=x[0]<=hi]
    # rare regions: forward branches whose skipped range holds DFMA/DADD or CALL targets
    skip=[]
    for a,op,arg in body:
        if op=='BRA':
            t=re.search(r'0x([0-9a-f]+)',arg)
            if t:
                tt=int(t.group(1),16)
                if a<tt<=hi and any(o in('DFMA','DADD','DMUL','DSETP') for b,o,_ in body if a<b<tt): skip.append((a+16,tt))
    c=collections.Counter()
    for a,op,arg in body:
        if any(x<=a<y for x,y in skip) or op=='NOP': continue
        c[op]+=1
    return sum(c.values()),c
for cub in sys.argv[1:]:
    for fn in ['turboquant_fast_values_d128','turboquant_fast_keys_mse_d128','turboquant_fast_keys_qjl_d128','turboquant_fast_values_d64','turboquant_fast_keys_mse_d64','turboquant_fast_keys_qjl_d64','turboquant_split_values_d128','turboquant_split_keys_mse_d128']:
        n,c=loop(cub,fn); rows=16
        print(cub.split('/')[-1],fn,n,'per row %.1f'%(n/rows), ' '.join('%s:%d'%kv for kv in c.most_common(12)))
