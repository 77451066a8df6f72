# ncu counters of main's 12 fast / split kernels (16 x 4k x 8 heads, 524,288 rows) -> per-row counts and floors
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = rows[0]; idx = {n: i for i, n in enumerate(h)}
R = 16 * 4096 * 8
SM = 132
F = 1.98e9                      # max SM clock (both cards)
COPY = {'H200': 4230e9, 'H100': 2980e9}  # copy ceilings: this call's median (H200); the lead's H100 run (v18)
def wr(name, d):
    if 'values' in name: return d // 2 + 2
    return d // 2 + (d // 8 if 'qjl' in name else 0) + 4
def prods(name):
    return (2 if 'split' in name else 1) + (1 if 'qjl' in name else 0)
print('| kernel | grid x regs | ncu µs (clock GHz) | DRAM MB read / written | bytes per row | warp instr per row | LSU / shared wavefronts per row | memory floor H200 / H100 µs | 80% line H200 / H100 µs | issue floor µs | LSU floor µs | tensor floor µs (products) |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|')
out = []
for r in rows[2:]:
    g = lambda k: float(r[idx[k]].replace(',', ''))
    n = r[idx['Kernel Name']]; d = 128 if n.endswith('128') else 64
    by = 2 * d + wr(n, d)
    inst = g('smsp__inst_executed.sum') / R
    lsu = g('l1tex__data_pipe_lsu_wavefronts.sum') / R
    shw = g('l1tex__data_pipe_lsu_wavefronts_mem_shared.sum') / R
    mem = {c: R * by / COPY[c] * 1e6 for c in COPY}
    issue = inst * R / (SM * 4 * F) * 1e6
    lsuf = lsu * R / (SM * F) * 1e6
    ten = prods(n) * (d * d) * R / (SM * 2048 * F) * 1e6  # 2048 f16 FMA per clock per SM (dense wgmma)
    out.append((n, d))
    print(f"| {n.replace('turboquant_','')} | {int(g('launch__grid_size'))} x {int(g('launch__registers_per_thread'))} | {g('gpu__time_duration.sum')/1e3:.1f} ({g('smsp__cycles_elapsed.avg.per_second')/1e9:.2f}) | "
          f"{g('dram__bytes_read.sum')/1e6:.0f} / {g('dram__bytes_write.sum')/1e6:.0f} | {by} | {inst:.1f} | {lsu:.1f} / {shw:.1f} | "
          f"{mem['H200']:.1f} / {mem['H100']:.1f} | {mem['H200']/0.8:.1f} / {mem['H100']/0.8:.1f} | {issue:.1f} | {lsuf:.1f} | {ten:.1f} ({prods(n)}) |")
