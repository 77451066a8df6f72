import re,sys,collections
def parse(fn):
    runs=[];cur=None
    for l in open(fn):
        m=re.match(r'== (\w+) (\d)',l)
        if m: cur={'v':m.group(1),'i':m.group(2),'rows':{},'app':{}}; runs.append(cur); continue
        m=re.search(r'copy ceiling (\d+) GB/s',l)
        if m and cur: cur['ceil']=int(m.group(1)); continue
        c=[x.strip() for x in l.strip().strip('|').split('|')]
        if len(c)==8 and c[0] in('64','128'):
            cur['rows'][(c[0],c[1],c[2],c[3])]=(float(c[4]),c[6])
        elif len(c)==4 and c[0] in('64','128') and 'token' in c[1]:
            cur['app'][(c[0],c[1],c[2])]=float(c[3])
    return runs
for fn in sys.argv[1:]:
    runs=parse(fn)
    vs=[]; [vs.append(r['v']) for r in runs if r['v'] not in vs]
    print('##',fn, ' ceilings:', ', '.join(f"{r['v']}{r['i']} {r['ceil']}" for r in runs))
    keys=list(runs[0]['rows'].keys())
    print('| d | shape | kernel | path | '+' | '.join(vs)+' | '+' | '.join(f'main / {v}' for v in vs[1:])+' |')
    print('|'+'---|'*(4+len(vs)+len(vs)-1))
    for k in keys:
        cells=[];sums={}
        for v in vs:
            rr=[r for r in runs if r['v']==v]
            t=[r['rows'][k][0] for r in rr]; pc=[r['rows'][k][1] for r in rr]
            sums[v]=sum(t)
            cells.append(' / '.join(f'{x:.4f}' for x in t)+' ('+', '.join(pc)+')')
        rat=[f"{sums['main']/sums[v]:.3f}x" for v in vs[1:]]
        print(f'| {k[0]} | {k[1].replace(" x ","x").replace("32768","32k").replace("4096","4k")} | {k[2]} | {k[3]} | '+' | '.join(cells)+' | '+' | '.join(rat)+' |')
    print()
    akeys=list(runs[0]['app'].keys())
    print('| d | append | path | '+' | '.join(vs)+' | '+' | '.join(f'main / {v}' for v in vs[1:])+' |')
    print('|'+'---|'*(3+len(vs)+len(vs)-1))
    for k in akeys:
        cells=[];sums={}
        for v in vs:
            t=[r['app'][k] for r in runs if r['v']==v]; sums[v]=sum(t)
            cells.append(' / '.join(f'{x:.2f}' for x in t))
        rat=[f"{sums['main']/sums[v]:.3f}x" for v in vs[1:]]
        print(f'| {k[0]} | {k[1]} | {k[2]} | '+' | '.join(cells)+' | '+' | '.join(rat)+' |')
    print()
