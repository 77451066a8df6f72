#!/usr/bin/env python3
"""SASS of one decode kernel by site (the statement of decode_body an instruction's inline chain
passes through), optionally joined with an Nsight Compute source export of the same code.

  sass_sites.py KERNEL SRC.cu:DISASM.sass[:NCU-SASS.csv] ...

DISASM.sass: `nvdisasm -gi` of a cubin compiled from SRC.cu with -lineinfo (nvcc 13.0,
-std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -cubin -lineinfo). With a CSV (`ncu -i R
--page source --csv --print-source sass`), prints executed warp instructions a tile (32,768 tiles
at 64 x 4k and 16 x 16k) and stall samples per site; the opcodes are checked to match line by
line. "handlers": instructions after the kernel's last EXIT (ptxas's divergence handlers).
"""
import csv, re, sys

def parse_chains(path, kernel):
    res, cur, pend, inside = [], [], [], False
    for ln in open(path):
        if ln.startswith('\t.section'):
            inside = ('.text.' + kernel + ',') in ln
            continue
        if not inside:
            continue
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', ln)
        if m:
            pend.append((m.group(1).split('/')[-1], int(m.group(2))))
            continue
        m = re.match(r'\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', ln)
        if m:
            if pend:
                cur, pend = pend, []
            res.append((int(m.group(1), 16), m.group(2), cur))
    return res

def ranges(src):
    L = open(src).read().split('\n')
    def find(pat, start=0):
        for i in range(start, len(L)):
            if re.search(pat, L[i]):
                return i + 1
        raise Exception(pat)
    b0 = find(r'void decode_body\('); b1 = find(r'cp_async_wait<0>\(\);', b0)
    loop = find(r'for \(u32 it = begin', b0)
    sf = find(r'if \(.*seg_first.*\) \{', loop); sl = find(r'st\.l = 0\.0f;', sf)
    sw = find(r'if \(active\) \{', sl); swe = find(r'every lane is done with the K half', sw)
    smx = find(r'float r = 1\.0f, c = 0\.0f;', swe); smxe = find(r'cp_async_wait<1>\(\);', smx)
    pv = find(r"if \((BRANCHES && )?active\) \{", smxe); pve = find(r'if \(.*qt >= 0 && seg_last', pv) - 1
    segp = pve + 1
    cases = {}
    pats = [(r'unit_qk_folded<D, 2>', 'qk_folded2'), (r'unit_qk_folded4_hi_rows|unit_qk_folded<D, 4>', 'qk_folded4'),
            (r'unit_qk_compressed<D, 4', 'qk_clamp4'), (r'unit_qk_compressed<D, 2', 'qk_clamp2'), (r'unit_qk_buffer', 'qk_buffer'),
            (r'kPvFolded4|unit_pv_folded<D, 4', 'pv_folded4'), (r'kPvFolded2|unit_pv_folded<D, 2', 'pv_folded2'),
            (r'kPvClamp4|unit_pv_compressed<D, 4', 'pv_clamp4'), (r'kPvClamp2|unit_pv_compressed<D, 2', 'pv_clamp2'),
            (r'kPvBuffer|unit_pv_buffer', 'pv_buffer')]
    for i in list(range(sw, swe + 1)) + list(range(pv, pve + 1)):
        for pat, name in pats:
            if re.search(pat, L[i - 1]):
                cases.setdefault(i, name)
    return dict(b0=b0, b1=b1, loop=loop, sf=sf, sl=sl, smx=smx, smxe=smxe, segp=segp, cases=cases)

def site(ch, R):
    ls = [l for f, l in ch if f.endswith('.cu') and R['b0'] <= l <= R['b1']]
    if not ls:
        return 'outside decode_body'
    l = ls[0]
    if R['sf'] <= l <= R['sl']: return 'segment start (query)'
    if l in R['cases']: return R['cases'][l]
    if R['smx'] < l < R['smxe']: return 'softmax'
    if R['segp'] <= l <= R['segp'] + 40: return 'segment partial'
    if l < R['loop']: return 'cursor, issue, lane remats'
    return 'loop other'

def opc(s):
    t = s.split(); t = t[1] if t[0].startswith('@') else t[0]
    return t.split('.')[0]

if __name__ == '__main__':
    kernel, tiles = sys.argv[1], 32768
    for spec in sys.argv[2:]:
        parts = spec.split(':'); R = ranges(parts[0]); r = parse_chains(parts[1], kernel)
        last_exit = max(a for a, op, ch in r if 'EXIT' in op.split()[-1] or op.split()[0] == 'EXIT')
        prof = None
        if len(parts) > 2:
            rows = list(csv.reader(open(parts[2]))); hdr = rows[1]
            data = [x for x in rows[2:] if len(x) == len(hdr)]
            assert len(data) == len(r), (len(data), len(r))
            si = hdr.index('Source')
            assert all(opc(a[1]) == opc(d[si].strip()) for a, d in zip(r, data)), 'opcodes differ'
            f = lambda x: float(x.replace(',', '')) if x not in ('', '-') else 0.0
            cols = [hdr.index(c) for c in ('Instructions Executed', 'stall_no_inst', 'Warp Stall Sampling (All Samples)')]
            prof = [[f(d[c]) for c in cols] for d in data]
        agg = {}
        for i, (a, op, ch) in enumerate(r):
            s = site(ch, R) if a <= last_exit else 'handlers'
            v = agg.setdefault(s, [0, 0.0, 0.0, 0.0]); v[0] += 1
            if prof:
                for k in range(3): v[k + 1] += prof[i][k]
        print(spec, 'instructions', len(r))
        for s in sorted(agg):
            v = agg[s]
            extra = f'  exec/tile {v[1] / tiles:7.1f}  no_inst {v[2]:5.0f}  samples {v[3]:5.0f}' if prof else ''
            print(f'  {s:28s} {v[0]:5d}{extra}')
