#!/usr/bin/env python3
"""Summarize the fast prefill's per-CTA traces (turbo_prefill --trace, FERRATTN_WGF_TRACE=1).

Usage: trace_summary.py [--words 8|10] trace_*.bin   (8: round 5's kernel, 10: round 6's; default 10)

Each file holds 8 (round 5) or 10 (round 6) little-endian u64 per CTA in linear block-index order (kTraceWords of
cuda-kernels/turbo_prefill.cu): 0 globaltimer at entry, 1 clock64 at entry, 2 clock64 once
warpgroup 0's Q block is in shared memory, 3 once its tile loop is done, 4 once its rows are
stored, 5 globaltimer then, 6 the latest globaltimer at which a consumer warpgroup stored its
rows, 7 SM id | tiles << 32; round 6 adds 8 clock64 once the producer thread starts its
copies and 9 clock64 once warpgroup 0's tile 0 has landed (its first S issued). The SM clock is taken as clock64 ticks over globaltimer ns of
warpgroup 0 (median over CTAs). Prints, per file, the share of the SMs' time (132 SMs x the
span from the first CTA's entry to the last store) spent in each phase of warpgroup 0's CTAs.
"""
import collections
import statistics as st
import struct
import sys


WORDS = 10
if len(sys.argv) > 2 and sys.argv[1] == '--words':
    WORDS = int(sys.argv[2])
    del sys.argv[1:3]


def load(fn):
    d = open(fn, 'rb').read()
    n = 8 * WORDS
    return [struct.unpack_from('<%dQ' % WORDS, d, i * n) for i in range(len(d) // n)]


print('| trace | SM clock GHz | span us | prologue | tile loop | store | rest of the CTA | gaps between CTAs | idle at the end | prologue us (median) | loop us per tile (median) | producer start us | tile 0 after Q us |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|---|')
for fn in sys.argv[1:]:
    r = [x for x in load(fn) if x[0]]
    ghz = st.median([(x[4] - x[1]) / (x[5] - x[0]) for x in r if x[5] > x[0]])
    t0 = min(x[0] for x in r)
    tend = max(x[6] for x in r)
    span = (tend - t0) / 1e3
    bysm = collections.defaultdict(list)
    for x in r:
        bysm[x[7] & 0xffffffff].append(x)
    tot = collections.Counter()
    for xs in bysm.values():
        xs.sort(key=lambda x: x[0])
        tot['gap'] += (xs[0][0] - t0) / 1e3
        for i, x in enumerate(xs):
            pro = (x[2] - x[1]) / ghz / 1e3
            loop = (x[3] - x[2]) / ghz / 1e3
            sto = (x[4] - x[3]) / ghz / 1e3
            tot['pro'] += pro
            tot['loop'] += loop
            tot['store'] += sto
            tot['rest'] += (x[6] - x[0]) / 1e3 - pro - loop - sto
            if i + 1 < len(xs):
                tot['gap'] += (xs[i + 1][0] - x[6]) / 1e3
        tot['tail'] += (tend - max(x[6] for x in xs)) / 1e3
    S = len(bysm) * span
    name = fn.split('/')[-1].replace('trace_', '').replace('.bin', '')
    pro_med = st.median([(x[2] - x[1]) / ghz / 1e3 for x in r])
    loop_tile = st.median([(x[3] - x[2]) / ghz / 1e3 / max(1, x[7] >> 32) for x in r])
    extra = ' - | - |'
    if WORDS >= 10:
        prod = st.median([(x[8] - x[1]) / ghz / 1e3 for x in r if x[8]])
        t0w = st.median([(x[9] - x[2]) / ghz / 1e3 for x in r if x[9]])
        extra = ' %.2f | %.2f |' % (prod, t0w)
    print('| %s | %.3f | %.0f | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.2f | %.3f |%s' % (
        name, ghz, span, 100 * tot['pro'] / S, 100 * tot['loop'] / S, 100 * tot['store'] / S,
        100 * tot['rest'] / S, 100 * tot['gap'] / S, 100 * tot['tail'] / S, pro_med, loop_tile, extra))
