import csv,sys
k=sys.argv[1]; n=int(sys.argv[2]) if len(sys.argv)>2 else 30
rows=list(csv.reader(open(k)))
h=rows[1]; data=rows[2:]
ix={x:i for i,x in enumerate(h)}
def f(r,c):
    try: return float(r[ix[c]].replace(',',''))
    except: return 0.0
tot=sum(f(r,'Warp Stall Sampling (All Samples)') for r in data)
stalls=[c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
print('total samples',tot,'lines',len(data))
# aggregate by stall reason
agg={c:sum(f(r,c) for r in data) for c in stalls}
print(' '.join(f'{c[6:]}={100*v/tot:.1f}%' for c,v in sorted(agg.items(),key=lambda x:-x[1]) if v>0))
top=sorted(data,key=lambda r:-f(r,'Warp Stall Sampling (All Samples)'))[:n]
for r in top:
    s=f(r,'Warp Stall Sampling (All Samples)')
    det=sorted(((f(r,c),c[6:]) for c in stalls),reverse=True)[:3]
    print(f"{r[ix['Address']]:>6} {100*s/tot:5.2f}% ex={f(r,'Instructions Executed'):>8.0f} {r[ix['Source']][:60]:60s} "+' '.join(f'{c}:{100*v/tot:.2f}' for v,c in det if v>0))
