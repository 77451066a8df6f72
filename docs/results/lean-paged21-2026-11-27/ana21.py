"""Grid-level view of `lean_paged --stamps N --stamps-out FILE` raw stamps (issue-9-paged21), for rows whose storages run
different grids (Lean-paper B=4 ctx 16k: contiguous 112 CTAs, paged 264), where paged20's per-CTA-index differences
(ana.py) do not apply.

Usage: python3 ana21.py RAW. Per storage (medians over launches; cycles of the SM clock, ns of %globaltimer):
CTAs, CTAs per SM, K/V stages per CTA, the launch's span (first entry to last end, ns), start skew (last entry - first, ns),
per-CTA medians of: entry -> stage 0 landed (prologue), cycles per later stage, last stage -> end (tail), entry -> end;
the last-ending CTA's own split (entry offset ns, prologue, stages x per-stage, tail, cycles); and CTA-cycles summed
over the grid divided by the SMs (the grid's work per SM). Slots as ferrattn::StampSlot in cuda-kernels/lean_decode.cu.
"""
import sys, collections, statistics as st
fn = sys.argv[1]
L = collections.defaultdict(lambda: collections.defaultdict(list))  # variant -> launch -> [words of each CTA]
order = []
for line in open(fn):
    t = line.split()
    if t[3] in ('p16', 'p64') and t[4] == 'ord':
        var = t[3] + ' ord'; rest = t[5:]
    else:
        var = t[3]; rest = t[4:]
    if var not in order: order.append(var)
    L[var][int(rest[0])].append(list(map(int, rest[2:])))
med = st.median
print('%-8s %5s %5s %7s %8s %7s | %8s %8s %7s %8s | last CTA: %7s %8s %6s %7s %7s %8s | %9s' % (
    'storage', 'CTAs', 'C/SM', 'stages', 'span ns', 'skew ns', 'prolog', 'stage', 'tail', 'total',
    'at ns', 'prolog', 'stages', 'stage', 'tail', 'total', 'cyc/SM'))
for v in order:
    rows = collections.defaultdict(list)
    for i, ws in L[v].items():
        g0 = min(w[0] for w in ws); g1 = max(w[13] for w in ws)
        sms = collections.Counter(w[1] & 0xffffffff for w in ws)
        units = [w[1] >> 32 for w in ws]
        rows['ctas'].append(len(ws)); rows['cpsm'].append(max(sms.values()))
        rows['units'].append(med(units)); rows['span'].append(g1 - g0)
        rows['skew'].append(max(w[0] for w in ws) - g0)
        pro = [w[7] - w[2] for w in ws]; tail = [w[12] - w[8] for w in ws]; tot = [w[12] - w[2] for w in ws]
        stg = [(w[8] - w[7]) / ((w[1] >> 32) - 1) for w in ws if (w[1] >> 32) > 1]
        rows['pro'].append(med(pro)); rows['tail'].append(med(tail)); rows['tot'].append(med(tot))
        rows['stage'].append(med(stg) if stg else 0)
        rows['cycsm'].append(sum(tot) / len(sms))
        last = max(ws, key=lambda w: w[13]); u = last[1] >> 32
        rows['l_at'].append(last[0] - g0); rows['l_pro'].append(last[7] - last[2]); rows['l_u'].append(u)
        rows['l_stage'].append((last[8] - last[7]) / (u - 1) if u > 1 else 0)
        rows['l_tail'].append(last[12] - last[8]); rows['l_tot'].append(last[12] - last[2])
    m = {k: med(x) for k, x in rows.items()}
    print('%-8s %5d %5d %7.1f %8.0f %7.0f | %8.0f %8.1f %7.0f %8.0f | %17.0f %8.0f %6.0f %7.1f %7.0f %8.0f | %9.0f' % (
        v, m['ctas'], m['cpsm'], m['units'], m['span'], m['skew'], m['pro'], m['stage'], m['tail'], m['tot'],
        m['l_at'], m['l_pro'], m['l_u'], m['l_stage'], m['l_tail'], m['l_tot'], m['cycsm']))
