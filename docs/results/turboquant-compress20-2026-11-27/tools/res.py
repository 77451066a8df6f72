import re,sys
def parse(f):
    out={};n=None
    for l in open(f):
        m=re.search(r"Function properties for (\S+)",l)
        if m:n=m.group(1)
        m=re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",l)
        if m and n: out.setdefault(n,{})['spill']=m.group(2)+"/"+m.group(3)
        m=re.search(r"Used (\d+) registers",l)
        if m and n: out.setdefault(n,{})['regs']=m.group(1)
    return out
b=parse(sys.argv[1]);c=parse(sys.argv[2])
for k in sorted(b):
    if 'fast' in k or 'split' in k: print(f"{k:34s} base {b[k].get('regs')} regs spill {b[k].get('spill')} | new {c[k].get('regs')} regs spill {c[k].get('spill')}")
