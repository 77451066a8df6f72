# waits in the loop (after the prologue's BAR.SYNC) on a scoreboard that a row load (LDG.E.128) wrote (w, not r):
# prints the distance in instructions from the youngest such load
import re,sys
rows=[]
for l in open(sys.argv[1]):
    m=re.match(r'(\w+) W([01]{6}) (w\d| {2}) (r\d| {2}) s(\d+)\s+(.*)',l.rstrip('\n'))
    if m: rows.append(m.groups())
bar=next(i for i,r in enumerate(rows) if 'BAR.SYNC' in r[5])
pend={}
out=[]
for i,(a,wm,wb,rb,st,ins) in enumerate(rows):
    mask=int(wm,2)
    for sb in range(6):
        if mask>>sb&1:
            p=pend.get(sb,[])
            g=[j for j,x in p if 'LDG.E.128' in x]
            if g and i>bar: out.append((i-max(g),a,sb,ins[:40]))
            pend[sb]=[]
    if wb.strip(): pend.setdefault(int(wb[1]),[]).append((i,ins))
print(' '.join(f'{d}@{a}' for d,a,sb,ins in out))
