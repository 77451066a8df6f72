import re,sys
def load(fn):
    txt=open(fn).read(); out={}
    for f in re.split(r'\n\s+Function : ',txt)[1:]:
        name=f.split('\n')[0].strip()
        out[name]=[(int(a,16),b.strip()) for a,b in re.findall(r'/\*([0-9a-f]{4,})\*/\s+([^;]*);',f)]
    return out
b=load('base.sass'); n=load('new2.sass')
def mix(ins,lo,hi):
    from collections import Counter
    c=Counter()
    for a,x in ins:
        if lo<=a<=hi:
            op=re.sub(r'^@!?U?P\w+\s+','',x).split()[0].split('.')[0]
            c[op]+=1
    return c
for fn in ['lean_decode_f16_d128_r4','lean_decode_paged_regs_f16_d128_r4','lean_decode_paged_deep_f16_d64_r1','lean_decode_f16_d64_r1','lean_decode_paged_regs_f16_d64_r1']:
    for tag,d in (('base',b),('new',n)):
        ins=d[fn]
        backs=[(a,int(m.group(1),16)) for a,x in ins for m in [re.search(r'BRA .*0x([0-9a-f]+)$',x)] if m and int(m.group(1),16)<a and a-int(m.group(1),16)>0x2000]
        # main loop head: target of the largest-span back-edge
        latch,head=max(backs,key=lambda t:t[0]-t[1])
        inner=[t for t in backs if t[1]==head and t[0]!=latch]
        end = inner[0][0] if inner else None
        if end is None:
            # base: find forward branches from the body to latch
            fw=[a for a,x in ins if head<a<latch and re.search(r'BRA .*0x%x$'%latch,x)]
            end=max(fw) if fw else latch
        c=mix(ins,head,end)
        tot=sum(c.values())
        print(f"{fn:40s} {tag:4s} head {head:#x} stage-end {end:#x} latch {latch:#x} body {tot} ins  BAR {c['BAR']} LDGSTS {c['LDGSTS']} LDS {c['LDS']+c['LDSM']} HMMA {c['HMMA']} BRA {c['BRA']}")
print('---- base forward jumps out of the stage')
for fn in ['lean_decode_f16_d128_r4','lean_decode_paged_regs_f16_d128_r4','lean_decode_paged_deep_f16_d64_r1']:
    ins=b[fn]
    backs=[(a,int(m.group(1),16)) for a,x in ins for m in [re.search(r'BRA .*0x([0-9a-f]+)$',x)] if m and int(m.group(1),16)<a and a-int(m.group(1),16)>0x2000]
    latch,head=max(backs,key=lambda t:t[0]-t[1])
    for a,x in ins:
        m=re.search(r'BRA .*0x([0-9a-f]+)$',x)
        if m and head<a<latch and int(m.group(1),16)-a>0x3000: print(fn,hex(a),x, 'body ins', sum(mix(ins,head,a).values()))
    print(fn,'latch block:',[ (hex(a),x) for a,x in ins if latch-0x60<=a<=latch])
