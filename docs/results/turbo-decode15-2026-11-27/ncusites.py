import csv,sys,lzma
rows=list(csv.reader(lzma.open(sys.argv[1],'rt')))
hdr=rows[1]; i_ni=hdr.index('stall_no_inst'); i_all=hdr.index('Warp Stall Sampling (All Samples)'); i_ex=hdr.index('Instructions Executed'); i_ad=hdr.index('Address'); i_src=hdr.index('Source')
blk=[]
for r in rows[2:]:
    if r and r[0]=='Kernel Name': break
    if len(r)>i_ni and r[i_ad].startswith('0x'): blk.append(r)
base=int(blk[0][i_ad],16)
def f(x):
    try: return float(x.replace(',',''))
    except: return 0.0
cuts=[int(x,16) for x in sys.argv[2:]]
ni=sum(f(r[i_ni]) for r in blk); al=sum(f(r[i_all]) for r in blk)
print('%d instructions, exec %.2f M (%.1f a tile), no_inst %d of %d samples (%.1f%%)'%(len(blk),sum(f(r[i_ex]) for r in blk)/1e6,sum(f(r[i_ex]) for r in blk)/32768,ni,al,100*ni/al))
edges=[0]+cuts+[1<<40]
for lo,hi in zip(edges,edges[1:]):
    sel=[r for r in blk if lo<=int(r[i_ad],16)-base<hi]
    print('  [%#x, %s) %4d instr  exec/tile %6.1f  no_inst %4d  samples %5d'%(lo, hex(hi) if hi<1<<40 else 'end', len(sel),sum(f(r[i_ex]) for r in sel)/32768,sum(f(r[i_ni]) for r in sel),sum(f(r[i_all]) for r in sel)))
