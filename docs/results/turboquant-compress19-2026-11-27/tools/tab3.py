# bench.txt (base and variants interleaved N times) -> markdown: every run's ms (% of that run's copy
# ceiling), the median, and base / variant over the medians. Usage: tab3.py bench.txt [base]
import re, sys, collections, statistics
base = sys.argv[2] if len(sys.argv) > 2 else 'base'
runs = collections.defaultdict(lambda: collections.defaultdict(list))  # variant -> key -> [(ms, pct)]
apps = collections.defaultdict(lambda: collections.defaultdict(list))
cur = None
for l in open(sys.argv[1]):
    m = re.match(r'== (\S+) (\d)', l)
    if m: cur = m.group(1); continue
    c = [x.strip() for x in l.strip().strip('|').split('|')]
    if len(c) == 8 and c[0] in ('64', '128'):
        runs[cur][(c[0], c[1], c[2], c[3])].append((float(c[4]), c[6]))
    elif len(c) == 4 and c[0] in ('64', '128') and 'token' in c[1]:
        apps[cur][(c[0], c[1], c[2])].append(float(c[3]))
vs = [base] + sorted(v for v in runs if v != base)
others = vs[1:]
med = lambda xs: statistics.median(xs)
out = ['| d | shape | kernel | path | ' + ' | '.join(f'{v} ms (% of copy)' for v in vs) + ' | ' +
       ' | '.join(f'{base} / {v} (medians)' for v in others) + ' |', '|' + '---|' * (4 + len(vs) + len(others))]
for k in runs[base]:
    cells = [' / '.join(f'{a:.4f}' for a, _ in runs[v][k]) + ' (' + ', '.join(p for _, p in runs[v][k]) + ')' for v in vs]
    m = {v: med([a for a, _ in runs[v][k]]) for v in vs}
    out.append('| ' + ' | '.join(k) + ' | ' + ' | '.join(cells) + ' | ' + ' | '.join(f'{m[base] / m[v]:.3f}x' for v in others) + ' |')
out += ['', '| d | append | path | ' + ' | '.join(f'{v} (µs)' for v in vs) + ' | ' + ' | '.join(f'{base} / {v}' for v in others) + ' |',
        '|' + '---|' * (3 + len(vs) + len(others))]
for k in apps[base]:
    cells = [' / '.join(f'{a:.2f}' for a in apps[v][k]) for v in vs]
    m = {v: med(apps[v][k]) for v in vs}
    out.append('| ' + ' | '.join(k) + ' | ' + ' | '.join(cells) + ' | ' + ' | '.join(f'{m[base] / m[v]:.3f}x' for v in others) + ' |')
print('\n'.join(out))
