# decode sm_90 control bits from cuobjdump -sass output: stall, yield, write SB, read SB, wait mask
import sys,re
lines=open(sys.argv[1]).read().split('\n')
out=[]
i=0
while i<len(lines):
    m=re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*/\* (0x[0-9a-f]+) \*/',lines[i])
    if m and i+1<len(lines):
        m2=re.search(r'/\* (0x[0-9a-f]+) \*/',lines[i+1])
        if m2:
            hi=int(m2.group(1),16); ctl=hi>>41
            stall=ctl&15; yld=(ctl>>4)&1; wb=(ctl>>5)&7; rb=(ctl>>8)&7; wm=(ctl>>11)&63
            s=f"{m.group(1)} W{wm:06b} {'w'+str(wb) if wb!=7 else '  '} {'r'+str(rb) if rb!=7 else '  '} s{stall:<2d} {m.group(2).strip().rstrip(' ;')}"
            out.append(s); i+=2; continue
    i+=1
print('\n'.join(out))
