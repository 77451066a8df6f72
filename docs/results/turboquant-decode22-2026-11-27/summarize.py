# Medians of tq.txt (this call's interleaved runs): one line per (shape, d, config), base -> new;
# "pack1": the branch with FERRATTN_TQ_PREPARE_PACK=1 (main's prepare grid) in the same rounds.
import re, sys, statistics as st
cur = None; runs = {}
for line in open(sys.argv[1]):
    m = re.match(r'-- .*?\./(tq_\w+) (.*)', line)
    if m:
        cur = m.group(1); d = 64 if '--head-dim 64' in m.group(2) else 128
        if 'PACK=1' in line: cur = 'tq_pack1'
        continue
    m = re.match(r'turboquant B=(\d+) ctx=(\d+) (?:d=\d+ )?(\S+): ([0-9.]+) ms', line)
    if m and cur:
        k = (int(m.group(1)), int(m.group(2)), d, m.group(3))
        runs.setdefault(k, {}).setdefault(cur[3:], []).append(float(m.group(4)) * 1000)
for k in sorted(runs):
    r = runs[k]; base = r.get('base', []); new = r.get('new', [])
    if not base or not new: continue
    mb, mn = st.median(base), st.median(new)
    extra = ' pack1 %s' % '/'.join('%.1f' % x for x in r['pack1']) if 'pack1' in r else ''
    print('%2dx%-6d d%-3d %-7s base %s new %s  med %.1f -> %.1f (%+.1f%%)%s' % (k[0], k[1], k[2], k[3],
          '/'.join('%.1f' % x for x in base), '/'.join('%.1f' % x for x in new), mb, mn, 100 * (mn / mb - 1), extra))
