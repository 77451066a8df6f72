"""Per-CTA step durations from `lean_paged --stamps N --stamps-out FILE` raw stamps (issue-9-paged20).

Usage: python3 ana.py RAW "contig,p16 ord,p64 ord,p16,p64". Prints, per step, the median over CTAs of each CTA's
median over launches (cycles of the SM clock), per storage, and each paged storage's difference from the first one
(per CTA index, then the median). Slots as ferrattn::StampSlot in cuda-kernels/lean_decode.cu.
"""
import sys, collections, statistics as st
fn, variants = sys.argv[1], sys.argv[2].split(',')
# raw line: name batch ctx variant(with possible space) i c w0..w15
data = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(fn):
    t = line.split()
    if t[3] in ('p16','p64') and t[4] == 'ord':
        var = t[3] + ' ord'; rest = t[5:]
    else:
        var = t[3]; rest = t[4:]
    i, c = int(rest[0]), int(rest[1]); w = list(map(int, rest[2:]))
    data[var][c].append((i, w))
def iv(w):
    u = w[1] >> 32
    d = {
     'rec': w[3]-w[2], 'words': (w[4]-w[3]) if (w[4] > w[3] and w[4] < w[5]) else 0,
     'first_copy': w[5]-w[2], 'prologue': w[6]-w[2], 'land0': w[7]-w[2], 'lat0': w[7]-w[5],
     'loop': w[8]-w[7], 'last_compute': w[9]-w[8], 'reduce': w[10]-w[9], 'flags': w[11]-w[10],
     'role': w[12]-w[11], 'total': w[12]-w[2], 'waitsum': w[14], 'units': u,
    }
    return d
keys = ['rec','words','first_copy','prologue','lat0','land0','loop','last_compute','reduce','flags','role','total','waitsum']
med = {}
for v in variants:
    per_cta = {}
    for c, lst in data[v].items():
        ivs = [iv(w) for _, w in lst]
        per_cta[c] = {k: st.median([x[k] for x in ivs]) for k in keys}
    med[v] = per_cta
print('median over CTAs of the per-CTA median over launches (cycles)')
print('%-14s' % 'step' + ''.join('%12s' % v for v in variants) + ''.join('%12s' % ('d ' + v) for v in variants[1:]))
for k in keys:
    row = [st.median([med[v][c][k] for c in med[v]]) for v in variants]
    diffs = [st.median([med[v][c][k] - med[variants[0]][c][k] for c in med[v]]) for v in variants[1:]]
    print('%-14s' % k + ''.join('%12.0f' % x for x in row) + ''.join('%12.0f' % x for x in diffs))
