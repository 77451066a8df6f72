import csv,sys,os
def f(r,ix,c):
    try: return float(r[ix[c]].replace(',',''))
    except: return 0.0
print('| kernel | samples | prologue | f64 norm branch | warpgroup arrive (wgmma) | long scoreboard in the loop | of it: the 3 largest lines | rest of the loop |')
print('|---|---|---|---|---|---|---|---|')
for k in sys.argv[1:]:
    rows=list(csv.reader(open(k))); h=rows[1]; data=rows[2:]; ix={x:i for i,x in enumerate(h)}
    S='Warp Stall Sampling (All Samples)'
    tot=sum(f(r,ix,S) for r in data)
    first=next(i for i,r in enumerate(data) if 'BAR.SYNC' in r[ix['Source']])+1
    loopn=max(f(r,ix,'Instructions Executed') for r in data)
    loopn=max(f(r,ix,'Instructions Executed') for r in data if 'HGMMA' in r[ix['Source']])
    pro=sum(f(r,ix,S) for r in data[:first])
    f64=sum(f(r,ix,S) for r in data[first:] if 0.1*loopn<f(r,ix,'Instructions Executed')<0.3*loopn)
    st=[c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
    arr=sum(f(r,ix,S)-sum(f(r,ix,c) for c in st) for r in data[first:] if f(r,ix,'Instructions Executed')>=0.3*loopn)
    lsb=[(f(r,ix,'stall_long_sb'),r[ix['Source']].strip()[:34]) for r in data[first:] if f(r,ix,'Instructions Executed')>=0.3*loopn]
    lsbt=sum(x for x,_ in lsb); top=sorted(lsb,reverse=True)[:3]
    rest=tot-pro-f64-arr-lsbt
    pc=lambda x: f'{100*x/tot:.1f}%'
    print(f"| {os.path.basename(k).replace('_sass.csv','')} | {tot:.0f} | {pc(pro)} | {pc(f64)} | {pc(arr)} | {pc(lsbt)} | "+', '.join(f'`{s}` {pc(x)}' for x,s in top)+f' | {pc(rest)} |')
