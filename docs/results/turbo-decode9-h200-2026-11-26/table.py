import re,sys,json,collections
txt=open(sys.argv[1]).read()
copy=float(re.search(r"'copy_gbs_torch': ([0-9.]+)",txt).group(1))
sd={}
for m in re.finditer(r"sdpa decode B=(\d+) sq=1 ctx=(\d+) .*?\{'cudnn': ([0-9.]+), 'flash': ([0-9.]+)\}",txt):
    b=int(m.group(1)); c=int(m.group(2))+37
    cu,fl=float(m.group(3))*1000,float(m.group(4))*1000
    sd[(b,c)]=(min(cu,fl),'cuDNN' if cu<fl else 'flash')
res=collections.defaultdict(list); mb={}
for m in re.finditer(r"^(\S+) turbo decode B=(\d+) ctx=(\d+) (\w+) default: ([0-9.]+) us per step, \d+ GB/s of ([0-9.]+) MB",txt,re.M):
    v,b,c,cache,us,MB=m.group(1),int(m.group(2)),int(m.group(3)),m.group(4),float(m.group(5)),float(m.group(6))
    res[(b,c,cache,v)].append(us); mb[(b,c,cache)]=MB
variants=[]
for k in res:
    if k[3] not in variants: variants.append(k[3])
print(f"copy ceiling {copy:.0f} GB/s; variants {variants}")
shapes=[(1,16384),(16,16384),(8,32768),(64,4096),(32,32768)]
def rng(xs): 
    a,b=min(xs),max(xs); return f"{a:.1f}" if abs(a-b)<0.05 else f"{a:.1f}-{b:.1f}"
def rr(xs,f):
    vals=sorted(f(x) for x in xs); a,b=vals[0],vals[-1]; return f"{a:.2f}x" if abs(a-b)<0.005 else f"{a:.2f}-{b:.2f}x"
def pc(xs,MB):
    vals=sorted(MB*1e6/(x*1e-6)/1e9/copy*100 for x in xs); a,b=round(vals[0]),round(vals[-1]); return f"{a}" if a==b else f"{a}-{b}"
for b,c in shapes:
    for cache in ['int4','mixed']:
        if (b,c,cache) not in mb: continue
        s,which=sd[(b,c)]; MB=mb[(b,c,cache)]
        cells=[]
        for v in variants:
            xs=res.get((b,c,cache,v))
            if not xs: cells.append(('-','-','-')); continue
            cells.append((rng(xs), rr(xs,lambda x:s/x), pc(xs,MB)))
        print(f"| {b} x {c} | {cache} | "+" | ".join(x[0] for x in cells)+f" | {s:.1f} ({which}) | "+" | ".join(x[1] for x in cells)+" | "+" / ".join(x[2] for x in cells)+"% |")
