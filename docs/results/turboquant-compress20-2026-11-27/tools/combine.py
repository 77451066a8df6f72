import re, collections, statistics, sys
def load(f):
    runs = collections.defaultdict(lambda: collections.defaultdict(list)); apps = collections.defaultdict(lambda: collections.defaultdict(list)); cur=None; ceil=collections.defaultdict(list)
    for l in open(f):
        m = re.match(r'== (\S+) (\d)', l)
        if m: cur = m.group(1); continue
        m = re.search(r'copy ceiling (\d+) GB/s', l)
        if m: ceil[cur].append(int(m.group(1)))
        c = [x.strip() for x in l.strip().strip('|').split('|')]
        if len(c) == 8 and c[0] in ('64','128'): runs[cur][(c[0],c[1],c[2],c[3])].append((float(c[4]), float(c[6].rstrip('%'))))
        elif len(c) == 4 and c[0] in ('64','128') and 'token' in c[1]: apps[cur][(c[0],c[1],c[2])].append(float(c[3]))
    return runs, apps
med = statistics.median
c1r, c1a = load(sys.argv[1]); c2r, c2a = load(sys.argv[2]); c3r, c3a = load(sys.argv[3])
r = lambda R, v, k: med([a for a, _ in R[v][k]])
print('| d | shape | kernel | path | main ms (% of copy) | tip ms (% of copy) | main / tip | call 1: main / 127ba66 PDL on, off | call 2: main / 127ba66, 90ff11d |')
print('|---|---|---|---|---|---|---|---|---|')
for k in c3r['base']:
    b = c3r['base'][k]; h = c3r['hyb'][k]
    pr = lambda xs: f"{min(p for _, p in xs):.1f}-{max(p for _, p in xs):.1f}%"
    print(f"| {' | '.join(k)} | {r(c3r,'base',k):.4f} ({pr(b)}) | {r(c3r,'hyb',k):.4f} ({pr(h)}) | **{r(c3r,'base',k)/r(c3r,'hyb',k):.3f}x** | {r(c1r,'base',k)/r(c1r,'new',k):.3f}x, {r(c1r,'base',k)/r(c1r,'newoff',k):.3f}x | {r(c2r,'base',k)/r(c2r,'new',k):.3f}x, {r(c2r,'base',k)/r(c2r,'late',k):.3f}x |")
print()
print('| d | append (keys QJL + values) | path | main µs | tip µs | main / tip | call 1: main / 127ba66 PDL on, off | call 2: main / 127ba66, 90ff11d |')
print('|---|---|---|---|---|---|---|---|')
a = lambda A, v, k: med(A[v][k])
for k in c3a['base']:
    print(f"| {' | '.join(k)} | {a(c3a,'base',k):.2f} | {a(c3a,'hyb',k):.2f} | **{a(c3a,'base',k)/a(c3a,'hyb',k):.3f}x** | {a(c1a,'base',k)/a(c1a,'new',k):.3f}x, {a(c1a,'base',k)/a(c1a,'newoff',k):.3f}x | {a(c2a,'base',k)/a(c2a,'new',k):.3f}x, {a(c2a,'base',k)/a(c2a,'late',k):.3f}x |")
