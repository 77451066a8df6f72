# ncu raw csv (--page raw --csv) -> one markdown column per profile: per-row counts over 524,288 rows
# (16 x 4k x 8 heads) and the stall reasons in cycles per issued instruction. Usage: summ3.py a_raw.csv ...
import csv, sys
ROWS = 524288
cols = []
for f in sys.argv[1:]:
    rows = list(csv.reader(open(f)))
    d = dict(zip(rows[0], rows[2]))
    g = lambda k: float(d[k].replace(',', '')) if k in d and d[k] not in ('', 'n/a') else float('nan')
    c = {'duration (µs)': g('gpu__time_duration.sum') / (1000 if g('gpu__time_duration.sum') > 1000 else 1),
         'warp instructions per row': g('smsp__inst_executed.sum') / ROWS,
         'shared wavefronts per row': g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum') / ROWS,
         'LSU wavefronts per row': g('l1tex__data_pipe_lsu_wavefronts.sum') / ROWS,
         'issue active, %': g('smsp__issue_active.avg.pct_of_peak_sustained_active'),
         'DRAM throughput, % of peak': g('dram__throughput.avg.pct_of_peak_sustained_elapsed'),
         'warps per scheduler': g('smsp__warps_active.avg.per_cycle_active'),
         'eligible warps per scheduler': g('smsp__warps_eligible.avg.per_cycle_active')}
    pre, suf = 'smsp__average_warps_issue_stalled_', '_per_issue_active.ratio'
    for k in rows[0]:
        if k.startswith(pre) and k.endswith(suf): c['stall ' + k[len(pre):-len(suf)]] = g(k)
    cols.append((f.split('/')[-1].replace('_raw.csv', ''), c))
keys = [k for k in cols[0][1] if not k.startswith('stall ')] + sorted(
    (k for k in cols[0][1] if k.startswith('stall ')), key=lambda k: -cols[0][1][k])
print('| metric | ' + ' | '.join(n for n, _ in cols) + ' |\n|' + '---|' * (1 + len(cols)))
for k in keys:
    if all(c.get(k, 0) < 0.005 for _, c in cols): continue
    print(f'| {k} | ' + ' | '.join(f'{c.get(k, float("nan")):.2f}' for _, c in cols) + ' |')
