import csv,lzma
L={('base','lean_decode_paged_regs_f16_d128_r4'):(0x6710,0xf740,None),('new','lean_decode_paged_regs_f16_d128_r4'):(0x6690,0xf640,0x9220),
   ('base','lean_decode_f16_d128_r4'):(0x5430,0xdb50,None),('new','lean_decode_f16_d128_r4'):(0x5420,0xda80,0x7670)}
for (b,k),(head,latch,inner) in L.items():
    rows=list(csv.reader(lzma.open(f'ncu-{b}-{k}.csv.xz','rt')))[1:]
    h=rows[0]; i=h.index('Address'); s=h.index('Source'); n=h.index('stall_no_inst'); a=h.index('Warp Stall Sampling (All Samples)'); e=h.index('Instructions Executed')
    b0=int(rows[1][i],16); d={}
    for r in rows[1:]:
        try: d[int(r[i],16)-b0]=(r[s].strip(),float(r[n] or 0),float(r[a] or 0),float(r[e] or 0))
        except: pass
    tot=sum(v[1] for v in d.values()); pre=sum(v[1] for o,v in d.items() if o<head)
    stage_end = inner if inner else latch
    stage=sum(v[1] for o,v in d.items() if head<=o<=(inner if inner else latch))
    print(f"{b:4s} {k:35s} samples {sum(v[2] for v in d.values()):.0f} warp-insts {sum(v[3] for v in d.values()):.0f} | no_inst all {tot:.0f}, before loop {pre:.0f}, loop+after {tot-pre:.0f}; latch {latch:#x} [{d[latch][0][:24]}] {d[latch][1]+d[latch-16][1]:.0f}" + (f"; inner back-edge {inner:#x} [{d[inner][0][:24]}] {d[inner][1]+d[inner-16][1]:.0f}" if inner else "") + f"; head [{d[head][0][:20]}]")
