#!/usr/bin/env python3
"""Round 11's per-CTA timeline of turbo_prefill_wgf_* (issue 11; docs/TURBO_CUDA.md).

Reads the traces `turbo_prefill --trace DIR` writes (ferrattn_cuda::turbo::TRACE_WORDS = 64
little-endian u64 per CTA, in linear block index order) from a kernel built with
FERRATTN_WGF_TIMELINE (words 10.. are the per-warpgroup timeline; turbo_prefill.cu,
kTraceWords). Prints, per trace: the SMs' time split (CTA time, gaps between CTAs on an SM,
idle at the start and end), and per CTA, medians over CTAs and warpgroups: entry -> producer's
first copy, entry -> Q in shared memory, Q -> tile 0's S issued, tile 0's S -> first P V issued,
the tile-loop cost per tile over tiles 0-8 and over tiles 8-56 (steady), the last segment's
excess over steady, the loop end -> rows stored, and the fixed cost per CTA (CTA time less
tiles x steady per tile). Usage: timeline.py trace_*.bin
"""
import struct
import sys
from statistics import median

W = 64
NC = 3


def load(path):
    raw = open(path, "rb").read()
    n = len(raw) // (8 * W)
    words = struct.unpack("<%dQ" % (n * W), raw[: n * W * 8])
    return [words[i * W:(i + 1) * W] for i in range(n)]


def med(xs):
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else float("nan")


def summarize(path):
    ctas = [c for c in load(path) if c[0] != 0]
    # SM clock: clock64 against globaltimer over each CTA's life (words 1 -> 4, 0 -> 5)
    ghz = med([(c[4] - c[1]) / (c[5] - c[0]) for c in ctas if c[5] > c[0] and c[4] > c[1]])
    us = lambda cyc: cyc / ghz / 1e3  # noqa: E731
    t0 = min(c[0] for c in ctas)
    t1 = max(c[6] for c in ctas)
    span = (t1 - t0) / 1e3
    sms = {}
    for c in ctas:
        sms.setdefault(c[7] & 0xffffffff, []).append((c[0], c[6]))
    nsm = len(sms)
    busy = gaps = head = tail = 0.0
    for lst in sms.values():
        lst.sort()
        head += (lst[0][0] - t0) / 1e3
        tail += (t1 - lst[-1][1]) / 1e3
        for a, b in lst:
            busy += (b - a) / 1e3
        for (a0, b0), (a1, b1) in zip(lst, lst[1:]):
            gaps += (a1 - b0) / 1e3
    tot = nsm * span
    print(f"## {path}: {len(ctas)} CTAs on {nsm} SMs, span {span:.1f} us, SM clock {ghz:.3f} GHz")
    print(f"SM time: in CTAs {100 * busy / tot:.1f}%, gaps between CTAs {100 * gaps / tot:.2f}%, "
          f"idle before the first CTA {100 * head / tot:.2f}%, idle after the last {100 * tail / tot:.2f}% "
          f"(the wave tail); CTA waves {len(ctas) / nsm:.2f}; mean gap {gaps / max(1, len(ctas) - nsm):.2f} us")
    ent_prod, ent_q, q_s, s_pv, fill, steady, last_x, store, fixed, cta_t, tiles = ([] for _ in range(11))
    per_tile_cta = []
    for c in ctas:
        cta_t.append((c[6] - c[0]) / 1e3)
        ent_prod.append(us(c[8] - c[1]))
        for w in range(NC):
            nt = c[50 + w]
            if nt == 0 or c[10 + w] == 0:
                continue
            tiles.append(nt)
            ent_q.append(us(c[10 + w] - c[1]))
            q_s.append(us(c[13 + w] - c[10 + w]))
            if c[16 + w]:
                s_pv.append(us(c[16 + w] - c[13 + w]))
            s = [c[19 + 8 * w + k] for k in range(8)]
            if nt > 8 and s[1]:
                fill.append(us(s[1] - s[0]) / 8)
            if nt > 56 and s[7]:
                st = us(s[7] - s[1]) / 48
                steady.append(st)
                last_x.append(us(c[43 + w] - s[7]) - (nt - 56) * st)
            if c[46 + w]:
                store.append(us(c[46 + w] - c[43 + w]))
    st = med(steady)
    for c in ctas:
        nt = c[7] >> 32
        if st == st and nt:
            fixed.append((c[6] - c[0]) / 1e3 - nt * st)
            per_tile_cta.append(((c[6] - c[0]) / 1e3, nt))
    print(f"median tiles per warpgroup {med(tiles)}, CTA time median {med(cta_t):.2f} us")
    if fixed:
        f_sum = sum(fixed)
        print(f"SM time in tiles at the steady rate {100 * (busy - f_sum) / tot:.1f}%, in the CTAs' fixed "
              f"cost {100 * f_sum / tot:.1f}% (mean {f_sum / len(fixed):.2f} us per CTA), idle "
              f"{100 * (tot - busy) / tot:.1f}%")
    print("| per CTA (medians) | us |\n|---|---|")
    rows = [
        ("entry -> producer's first copy", med(ent_prod)),
        ("entry -> Q block in shared memory", med(ent_q)),
        ("Q -> tile 0's S issued", med(q_s)),
        ("tile 0's S -> first P V issued", med(s_pv)),
        ("per tile, tiles 0-8 (fill)", med(fill)),
        ("per tile, tiles 8-56 (steady)", st),
        ("fill excess (tiles 0-8 over steady)", 8 * (med(fill) - st)),
        ("last tiles' excess over steady (tile 56 -> loop end)", med(last_x)),
        ("loop end -> rows stored (other warpgroups' tiles, store)", med(store)),
        ("fixed cost per CTA (CTA time - tiles x steady)", med(fixed)),
    ]
    for name, v in rows:
        print(f"| {name} | {v:.3f} |")
    if per_tile_cta:
        # least squares of CTA time = a + b tiles (useful for causal grids, where tiles vary)
        n = len(per_tile_cta)
        mx = sum(t for _, t in per_tile_cta) / n
        my = sum(y for y, _ in per_tile_cta) / n
        sxx = sum((t - mx) ** 2 for _, t in per_tile_cta)
        if sxx > 0:
            b = sum((t - mx) * (y - my) for y, t in per_tile_cta) / sxx
            print(f"fit CTA time = {my - b * mx:.2f} us + {b:.4f} us x tiles over {n} CTAs")
    print()


for f in sys.argv[1:]:
    summarize(f)
