# find instructions in the loop that wait on an SB that an LDG (global) wrote after the SB's previous non-LDG writer
import sys,re
L=[l.split(None,5) for l in open(sys.argv[1])]
# fields: addr, Wmask, wN or '', ...
rows=[]
for l in open(sys.argv[1]):
    m=re.match(r'(\w+) W([01]{6}) (w\d| {2}) (r\d| {2}) s(\d+)\s+(.*)',l.rstrip('\n'))
    if m: rows.append(m.groups())
pending={}  # sb -> list of (addr, op, isglobal)
for a,wm,wb,rb,st,ins in rows:
    mask=int(wm,2)
    for sb in range(6):
        if mask>>sb &1:
            p=pending.get(sb,[])
            kinds=set(('G' if 'LDG' in x[1] or 'STG' in x[1] else 'S') for x in p)
            if "G" in kinds and "S" in kinds and int(a,16)>0x2000:
                print(f'{a} waits SB{sb}: {ins[:50]:50s} <- '+'; '.join(f'{x[0]}:{x[1][:28]}' for x in p[-4:]))
            pending[sb]=[]
    for w in (wb,rb):
        if w.strip():
            sb=int(w.strip()[1]); pending.setdefault(sb,[]).append((a,ins))
