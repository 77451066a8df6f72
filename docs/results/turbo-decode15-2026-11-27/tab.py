# The timing tables of docs/TURBO_CUDA.md "Decode: the INT8 buffer tile out of line in the mixed instance" (decode15;
# decode14's tab.py with a third label): python3 tab.py decode.txt sdpa.json [NEW [BASE]] (NEW, BASE: the labels of the
# two columns, default new / base; call 3 also has buf). Rows `LABELN` of decode.txt; SDPA and the copy ceiling from sdpa.json
# (bench_sdpa.py's jobs in the order of jobs-decode.json: 1 x 16k, 64 x 4k, 16 x 16k, 8 x 32k, 32 x 32k).
import re, sys, json, statistics, collections
d = collections.defaultdict(list); mb = {}; kern = {}
for ln in open(sys.argv[1]):
    m = re.match(r'(base|new|buf)\d turbo decode B=(\d+) ctx=(\d+) (\w+) default: ([\d.]+) us per step, \d+ GB/s of ([\d.]+) MB, ([^,\s]+)(?:, (\S+))?\s*$', ln)
    if m:
        k = (m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)); d[k].append(float(m.group(5)))
        mb[k[1:]] = float(m.group(6)); kern[k] = m.group(8) or "(not printed)"
NEW = sys.argv[3] if len(sys.argv) > 3 else 'new'; BASE = sys.argv[4] if len(sys.argv) > 4 else 'base'
s = json.load(open(sys.argv[2])); ceil = s['ceilings']['copy_gbs_torch']
order = [(1, 16384), (64, 4096), (16, 16384), (8, 32768), (32, 32768)]
sd = {}
for (b, c), r in zip(order, s['results']):
    best = min((v['median_ms'] * 1e3, n) for n, v in r.items() if isinstance(v, dict) and 'median_ms' in v)
    sd[b] = best
print(f"copy ceiling {ceil:.0f} GB/s")
shapes = [(1, 16384), (16, 16384), (8, 32768), (64, 4096), (32, 32768)]
rng = lambda x: f"{min(x):.1f}-{max(x):.1f}" if min(x) != max(x) else f"{x[0]:.1f}"
print("| B x ctx | cache | base us | new us | new / base (medians) | faster SDPA us | base vs SDPA | new vs SDPA | % of copy base / new | new's kernel |")
print("|---|---|---|---|---|---|---|---|---|---|")
for cache in ['int4', 'mixed']:
    for b, c in shapes:
        x, y = d[(BASE, b, c, cache)], d[(NEW, b, c, cache)]
        if not x or not y: continue
        mx, my = statistics.median(x), statistics.median(y); by = mb[(b, c, cache)]
        pc = lambda t: 100 * by * 1e6 / (t * 1e-6) / (ceil * 1e9)
        t, n = sd[b]
        print(f"| {b} x {c} | {cache} | {rng(x)} | {rng(y)} | {100*(my/mx-1):+.1f}% | {t:.1f} ({n}) | {t/max(x):.2f}-{t/min(x):.2f}x | {t/max(y):.2f}-{t/min(y):.2f}x | {pc(max(x)):.1f}-{pc(min(x)):.1f} / {pc(max(y)):.1f}-{pc(min(y)):.1f}% | {kern[(NEW, b, c, cache)].replace('turbo_decode_', '')} |")
