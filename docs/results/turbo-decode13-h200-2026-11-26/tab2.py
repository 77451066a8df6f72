# The two timing tables of docs/TURBO_CUDA.md "Decode: the tile's format as branches, and the combine under PDL
# where it pays": python3 tab2.py pooled (calls 1 and 2) | python3 tab2.py call3 | python3 tab2.py call4 (SDPA and
# the ceilings typed in from decode3.txt, decode4.txt).
import re, sys, statistics, collections
def load(files):
    d = collections.defaultdict(list); by = {}
    for f in files:
        for ln in open(f):
            m = re.match(r'(\S+) turbo decode B=(\d+) ctx=(\d+) (\w+) default: ([\d.]+) us per step, \d+ GB/s of ([\d.]+) MB', ln)
            if m:
                k = (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)); d[k].append(float(m.group(5))); by[k[1:]] = float(m.group(6))
    return d, by
shapes = [(1,16384),(16,16384),(8,32768),(64,4096),(32,32768)]
def rng(x): return f"{min(x):.1f}-{max(x):.1f}" if min(x)!=max(x) else f"{x[0]:.1f}"
mode = sys.argv[1]
if mode == 'pooled':
    d, by = load(['decode1.txt','decode2.txt'])
    print("| B x ctx | cache | base us | new us | new / base | base + PDL us | new + PDL us | new + PDL / base |")
    print("|---|---|---|---|---|---|---|---|")
    for cache in ['int4','mixed']:
        for b,c in shapes:
            med = {v: statistics.median(d[(v,b,c,cache)]) for v in ['base','new','base-pdl','new-pdl']}
            f = lambda v: rng(d[(v,b,c,cache)])
            print(f"| {b} x {c} | {cache} | {f('base')} | {f('new')} | {100*(med['new']/med['base']-1):+.1f}% | {f('base-pdl')} | {f('new-pdl')} | {100*(med['new-pdl']/med['base']-1):+.1f}% |")
else:
    four = mode == 'call4'
    d, by = load(['decode4.txt' if four else 'decode3.txt'])
    ceil = 4205.782229507573 if four else 4247.038174752768
    sd = {1:30.9, 16:263.7, 8:274.8, 64:288.5, 32:1097.1} if four else {1:30.1, 16:260.7, 8:267.8, 64:290.2, 32:1104.6}
    sdn = {1:'flash',16:'cuDNN' if four else 'flash',8:'flash',64:'cuDNN',32:'cuDNN'}
    print("| B x ctx | cache | base us | tip us | tip / base (medians) | faster SDPA us | base vs SDPA | tip vs SDPA | % of copy base / tip |")
    print("|---|---|---|---|---|---|---|---|---|")
    for cache in ['int4','mixed']:
        for b,c in shapes:
            x, y = d[('base',b,c,cache)], d[('tip',b,c,cache)]
            mb, mt = statistics.median(x), statistics.median(y); mbytes = by[(b,c,cache)]
            pc = lambda t: 100*mbytes*1e6/(t*1e-6)/(ceil*1e9)
            print(f"| {b} x {c} | {cache} | {rng(x)} | {rng(y)} | {100*(mt/mb-1):+.1f}% | {sd[b]} ({sdn[b]}) | {sd[b]/max(x):.2f}-{sd[b]/min(x):.2f}x | {sd[b]/max(y):.2f}-{sd[b]/min(y):.2f}x | {pc(max(x)):.1f}-{pc(min(x)):.1f} / {pc(max(y)):.1f}-{pc(min(y)):.1f}% |")
