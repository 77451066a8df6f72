import csv,sys
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[1]; data=[r for r in rows[2:] if len(r)==len(hdr)]
ex=hdr.index("Instructions Executed"); src=hdr.index("Source"); smp=hdr.index("Warp Stall Sampling (All Samples)")
ni=hdr.index("stall_no_inst")
def n(x):
    try: return float(x.replace(',',''))
    except: return 0.0
tiles=float(sys.argv[2])
exe=[n(r[ex]) for r in data]
print("instrs",len(data),"executed>0",sum(1 for e in exe if e>0),"bytes",16*sum(1 for e in exe if e>0))
for th in [0.5,0.1,0.02]:
    print(f" executed >= {th} per tile: {sum(1 for e in exe if e>=th*tiles)} instrs")
print(" warp instrs per tile", sum(exe)/tiles)
# where are no_inst stalls: by region of 256 instrs
reg={}
for i,r in enumerate(data):
    reg.setdefault(i//256,[0,0,0])
    reg[i//256][0]+=n(r[ni]); reg[i//256][1]+=n(r[smp]); reg[i//256][2]+=n(r[ex])
for k,v in sorted(reg.items()):
    if v[1]>0: print(f"  [{k*256:5d},{k*256+256:5d}) no_inst {v[0]:5.0f} samples {v[1]:5.0f} exec/tile {v[2]/tiles:7.1f}")
