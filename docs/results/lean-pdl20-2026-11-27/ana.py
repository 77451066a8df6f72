import re,sys,collections
# parse paged.txt: "[+Ns] cmd" headers followed by rows
def parse(path):
    runs=[];cur=None
    for line in open(path):
        m=re.match(r'\[\+\d+s\] (.*)',line)
        if m: cur=[m.group(1).strip(),[]]; runs.append(cur); continue
        m=re.match(r'(llama|lean)\s+(\d+)\s+(\d+)\s+(\d+) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) \|',line)
        if m and cur is not None:
            t=list(map(float,m.groups()[4:10]))
            cur[1].append(((m.group(1),int(m.group(2)),int(m.group(3))),t))
    return runs
runs=parse(sys.argv[1])
by=collections.OrderedDict()
for cmd,rows in runs:
    if '--only' in cmd: continue
    for k,t in rows: by.setdefault(cmd,collections.OrderedDict()).setdefault(k,[]).append(t)
rows=list(next(iter(by.values())).keys())
for k in rows:
    print("%s B=%d ctx=%d"%k)
    for cmd in by:
        ts=by[cmd].get(k,[])
        if not ts: continue
        c=[t[0] for t in ts]; p16=[t[1] for t in ts]
        rat=[[t[i]/t[0] for t in ts] for i in range(1,5)]
        f=lambda x:"%.2f-%.2f"%(min(x),max(x)) if len(x)>1 else "%.2f"%x[0]
        g=lambda x:"%.3f-%.3f"%(min(x),max(x)) if len(x)>1 else "%.3f"%x[0]
        print("   %-44s contig %-13s p16 %-13s | %s"%(cmd[:44],f(c),f(p16)," / ".join(g(r) for r in rat)))
