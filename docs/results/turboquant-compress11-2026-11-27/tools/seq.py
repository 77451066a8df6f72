import csv,sys
k=sys.argv[1]; lo=int(sys.argv[2],16) if len(sys.argv)>2 else 0; hi=int(sys.argv[3],16) if len(sys.argv)>3 else 1<<62
rows=list(csv.reader(open(k)))
h=rows[1]; data=rows[2:]
ix={x:i for i,x in enumerate(h)}
def f(r,c):
    try: return float(r[ix[c]].replace(',',''))
    except: return 0.0
tot=sum(f(r,'Warp Stall Sampling (All Samples)') for r in data)
stalls=[c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
base=int(data[0][ix['Address']],16)
for r in data:
    a=int(r[ix['Address']],16)-base
    if not (lo<=a<hi): continue
    s=f(r,'Warp Stall Sampling (All Samples)')
    det=sorted(((f(r,c),c[6:]) for c in stalls),reverse=True)[:2]
    print(f"{a:05x} {100*s/tot:5.2f} {f(r,'Instructions Executed'):>7.0f} {r[ix['Source']][:64]:64s} "+' '.join(f'{c}:{100*v/tot:.2f}' for v,c in det if v>0.05*tot/100))
