# bench.txt (main and the variants interleaved twice) -> tables.md: ms of both runs, % of that
# run's copy ceiling, main / variant over the sums of both runs
import re, sys, collections
runs = collections.defaultdict(dict)  # (variant, i) -> {row key: (ms, pct)}
apps = collections.defaultdict(dict)
cur = None
for l in open(sys.argv[1]):
    m = re.match(r'== (\S+) (\d)', l)
    if m: cur = (m.group(1), m.group(2)); continue
    c = [x.strip() for x in l.strip().strip('|').split('|')]
    if len(c) == 8 and c[0] in ('64', '128'):
        runs[cur][(c[0], c[1], c[2], c[3])] = (float(c[4]), c[6])
    elif len(c) == 4 and c[0] in ('64', '128') and 'token' in c[1]:
        apps[cur][(c[0], c[1], c[2])] = float(c[3])
vs = sorted({v for v, _ in runs}, key=lambda v: (v != 'main', v))
others = [v for v in vs if v != 'main']
out = ['| d | shape | kernel | path | ' + ' | '.join(vs) + ' | ' + ' | '.join('main / ' + v for v in others) + ' |',
       '|' + '---|' * (4 + len(vs) + len(others))]
for k in runs[('main', '1')]:
    cells = []
    for v in vs:
        a, b = runs[(v, '1')][k], runs[(v, '2')][k]
        cells.append(f'{a[0]:.4f} / {b[0]:.4f} ({a[1]}, {b[1]})')
    s = {v: runs[(v, '1')][k][0] + runs[(v, '2')][k][0] for v in vs}
    out.append('| ' + ' | '.join(k) + ' | ' + ' | '.join(cells) + ' | ' + ' | '.join(f"{s['main'] / s[v]:.3f}x" for v in others) + ' |')
out += ['', '| d | append | path | ' + ' | '.join(v + ' (µs)' for v in vs) + ' | ' + ' | '.join('main / ' + v for v in others) + ' |',
        '|' + '---|' * (3 + len(vs) + len(others))]
for k in apps[('main', '1')]:
    cells = [f"{apps[(v, '1')][k]:.2f} / {apps[(v, '2')][k]:.2f}" for v in vs]
    s = {v: apps[(v, '1')][k] + apps[(v, '2')][k] for v in vs}
    out.append('| ' + ' | '.join(k) + ' | ' + ' | '.join(cells) + ' | ' + ' | '.join(f"{s['main'] / s[v]:.3f}x" for v in others) + ' |')
print('\n'.join(out))
