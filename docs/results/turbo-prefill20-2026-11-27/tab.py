import re,sys,glob,statistics,json,os
d=sys.argv[1]; names=sys.argv[2].split(',')
rows={}
for n in names:
    for f in sorted(glob.glob(f'{d}/bench_{n}_*.txt')):
        for line in open(f):
            m=re.match(r'turbo prefill (\d+) x (\d+) causal (\w+)( llm)? fast: ([\d.]+) ms total',line)
            if m:
                k=(('LLM-like' if m.group(4) else 'uniform'),f'{m.group(1)} x {m.group(2)}',m.group(3))
                rows.setdefault(k,{}).setdefault(n,[]).append(float(m.group(5)))
sd={}
if os.path.exists(f'{d}/sdpa.json'):
    jobs=json.load(open(sys.argv[3]))['jobs']
    for j,r in zip(jobs,json.load(open(f'{d}/sdpa.json'))['results']):
        sd[(f"{j.get('batch')} x {j.get('sq')}",str(j.get('causal')).lower())]=(r.get('cudnn',{}).get('median_ms'),r.get('flash',{}).get('median_ms'))
print('| inputs, shape | '+' | '.join(f'{n} (runs)' for n in names)+' | '+' | '.join(f'{names[0]} / {n}' for n in names[1:])+' | cuDNN | flash | '+' | '.join(f'{n} vs cuDNN' for n in names)+' |')
print('|'+'---|'*(1+len(names)+len(names)-1+2+len(names)))
for k,v in rows.items():
    med={n:statistics.median(v[n]) for n in names if n in v}
    c=sd.get((k[1],k[2]),(None,None))
    cells=[' / '.join(f'{x:.3f}' for x in v.get(n,[])) for n in names]
    rat=[f'{med[names[0]]/med[n]:.3f}x' for n in names[1:]]
    cu=f'{c[0]:.3f}' if c[0] and k[0]=='uniform' else ''
    fl=f'{c[1]:.3f}' if c[1] and k[0]=='uniform' else ''
    vs=[f'{c[0]/med[n]:.3f}x' if c[0] and k[0]=='uniform' else '' for n in names]
    print(f"| {k[0]} {k[1]}{' causal' if k[2]=='true' else ''} | "+' | '.join(cells)+' | '+' | '.join(rat)+f' | {cu} | {fl} | '+' | '.join(vs)+' |')
