import re,sys,statistics as st,collections
d=collections.defaultdict(list); units={}
for line in open(sys.argv[1]):
    m=re.match(r"(td_\w+?)(\d) turbo decode B=(\d+) ctx=(\d+) (\w+) default: ([\d.]+) us.*?, (StreamK\(\d+\)|Balanced \{.*?\} \}|PerTile)(?: \((\d+) units\))?",line)
    if not m: continue
    b,rep,B,ctx,cache,us,sch,u=m.groups()
    if b=='td_main': key='main'
    elif sch.startswith('StreamK'): key='new-auto'
    else:
        c=re.search(r"buffer_tile: (\d+), segment: (\d+)",sch); key='bal %s:%s'%c.groups()
    d[(int(B),int(ctx),cache,key)].append(float(us)); 
    if u: units[(int(B),int(ctx),cache,key)]=u
shapes=sorted(set(k[:3] for k in d),key=lambda k:(k[2],k[0]*k[1],k[0]))
keys=['main','new-auto','bal 16:0','bal 21:7','bal 28:7','bal 24:12']
print("| B x ctx | cache | "+" | ".join(keys)+" |")
for s in shapes:
    base=st.median(d[s+('main',)])
    row=[]
    for k in keys:
        v=d.get(s+(k,))
        if not v: row.append('-'); continue
        med=st.median(v)
        row.append("%.1f (%+.1f%%) [%s]%s"%(med,100*(med/base-1),"/".join("%.1f"%x for x in v), " u=%s"%units.get(s+(k,),'') if k.startswith('bal') else ''))
    print("| %d x %d | %s | "%s+" | ".join(row)+" |")
