import csv,sys,collections
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[1]; data=[r for r in rows[2:] if len(r)==len(hdr)]
ix={h:i for i,h in enumerate(hdr)}
def n(x):
    try: return float(x.replace(',',''))
    except: return 0.0
cols=['stall_wait','stall_selected','stall_not_selected','stall_long_sb','stall_math','stall_short_sb','stall_no_inst','stall_mio','stall_lg','stall_branch_resolving','stall_dispatch','stall_barrier','stall_membar','stall_drain','stall_sleep']
b=collections.defaultdict(lambda: collections.Counter())
cnt=collections.Counter()
for r in data:
    e=int(n(r[ix['Instructions Executed']]))
    key=e if e in (16320,16448,32768,32640,16384) else ('rare<1000' if e<1000 else 'other')
    for c in cols: b[key][c]+=n(r[ix[c]])
    b[key]['samples']+=n(r[ix['Warp Stall Sampling (All Samples)']])
    b[key]['exec']+=e; cnt[key]+=1
tot=sum(v['samples'] for v in b.values())
for k,v in sorted(b.items(), key=lambda kv:-kv[1]['samples']):
    print(f"exec={k}: lines {cnt[k]} exec {v['exec']:.0f} samples {v['samples']:.0f} ({100*v['samples']/tot:.1f}%) ", ' '.join(f"{c[6:]}={v[c]:.0f}" for c in cols if v[c]>0))
