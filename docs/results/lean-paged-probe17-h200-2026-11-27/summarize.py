"""Summarise a paged_read_probe.py JSON file.

Per shape, order and grid: each layout / contiguous, then shuffled / in order and win256k / in
order (the placement's own cost, same kernel and grid). Usage: python3 summarize.py probe.json
"""
import json
import sys

LAYOUTS = ["ordered16", "shuffled16", "win256k16", "ordered64", "shuffled64", "win256k64"]
PAIRS = [("shuffled16", "ordered16"), ("win256k16", "ordered16"), ("shuffled64", "ordered64")]

j = json.load(open(sys.argv[1]))
print(f"{j['device']} copy ceiling {j['copy_ceiling_gbs']:.0f} GB/s")
groups = {}
for r in j["rows"]:
    key = (r["shape"], r["batch"], r["ctx"], r["order"], r["per_sm"], r["grid"])
    groups.setdefault(key, {})[r["layout"]] = r
print(f"{'shape':<14} {'order':<9} {'/SM':>3} {'grid':>5} {'contig us':>9} {'GB/s':>5} | "
      f"{'ord16':>6} {'shuf16':>6} {'win16':>6} {'ord64':>6} {'shuf64':>6} {'win64':>6} | "
      f"{'s16/o16':>7} "
      f"{'w16/o16':>7} {'s64/o64':>7}")
for (shape, batch, ctx, order, per_sm, grid), rs in groups.items():
    c = rs["contiguous"]
    ratios = " ".join(f"{rs[l]['vs_contiguous']:6.3f}" if l in rs else "     -" for l in LAYOUTS)
    pairs = " ".join(f"{rs[a]['us'] / rs[b]['us']:7.3f}" if a in rs else "      -"
                     for a, b in PAIRS)
    print(f"{f'{shape}:{batch}:{ctx}':<14} {order:<9} {per_sm:>3} {grid:>5} {c['us']:9.2f} "
          f"{c['gbs']:5.0f} | {ratios} | {pairs}")
