import re,sys,statistics as st,collections,json
# usage: final_tab.py decode.txt sweep.txt sdpa.txt ceiling mode
dec,sw,sd,ceil,mode=sys.argv[1],sys.argv[2],sys.argv[3],float(sys.argv[4]),sys.argv[5]
d=collections.defaultdict(list); mb={}
def add(key,us): d[key].append(float(us))
for line in open(dec):
    m=re.match(r"(td_\w+?)(\d) turbo decode B=(\d+) ctx=(\d+) (\w+) default: ([\d.]+) us per step, \d+ GB/s of ([\d.]+) MB, (.*)",line)
    if not m: continue
    b,rep,B,ctx,cache,us,MB,rest=m.groups(); s=(int(B),int(ctx),cache); mb[s]=float(MB)
    if b=='td_main': add(s+('base',),us)
    elif mode=='final': add(s+('new',),us)
    elif 'buffer_tile: 21, segment: 7' in rest: add(s+('new',),us)
if mode!='final' and sw!='-':
    for line in open(sw):
        m=re.match(r"sw(\d) turbo decode B=4 ctx=16384 (\w+) default: ([\d.]+) us.*Balanced \{ units: 1024, costs: DecodeCosts \{ tile: 16, buffer_tile: 21, segment: 7",line)
        if m: d[(4,16384,m.group(2),'new4')].append(float(m.group(3)))
    for c in ['int4','mixed']:
        if (4,16384,c,'new4') in d: d[(4,16384,c,'new')]=d[(4,16384,c,'new4')]
sdpa={}
for line in open(sd):
    m=re.match(r"sdpa decode B=(\d+) sq=1 ctx=(\d+).*?(\{.*\})",line)
    if m:
        v=eval(m.group(3)); k=min(v,key=v.get); sdpa[int(m.group(1)),int(m.group(2))+37]=(v[k]*1e3,k)
print("| B x ctx | cache | base us | new us | new / base (medians) | faster SDPA us | base vs SDPA | new vs SDPA | % of copy base / new |")
print("|---|---|---|---|---|---|---|---|---|")
for c in ['int4','mixed']:
  for (B,ctx) in [(1,16384),(4,16384),(16,16384),(8,32768),(64,4096),(32,32768)]:
    s=(B,ctx,c); b=d[s+('base',)]; n=d[s+('new',)]
    if not n: continue
    sp,k=sdpa[(B,ctx)]
    rng=lambda v:"%.1f"%min(v) if min(v)==max(v) else "%.1f-%.1f"%(min(v),max(v))
    pct=lambda v:"%.1f-%.1f"%(100*mb[s]/max(v)/1e-3/1e3/ceil*1e-3*1e3, 100*mb[s]/min(v)/ceil)
    p=lambda v:(100*mb[s]*1e6/(max(v)*1e-6)/1e9/ceil,100*mb[s]*1e6/(min(v)*1e-6)/1e9/ceil)
    pb,pn=p(b),p(n)
    rat=lambda v:"%.2f-%.2fx"%(sp/max(v),sp/min(v))
    print("| %d x %d | %s | %s | %s | %+.1f%% | %.1f (%s) | %s | %s | %.1f-%.1f / %.1f-%.1f%% |"%(B,ctx,c,rng(b),rng(n),100*(st.median(n)/st.median(b)-1),sp,k,rat(b),rat(n),pb[0],pb[1],pn[0],pn[1]))
