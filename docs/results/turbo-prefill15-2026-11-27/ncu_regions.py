# Round 15: stall samples of turbo_prefill_wgf_bf16_d128 (ncu source page, SASS) per reason, the whole kernel
# and by region: the shift blocks (SHF.R.S64 and the 5 set-up instructions before them), the instructions from
# the wait for tile j-1's P V (WARPGROUP.DEPBAR.LE gsb0, 0x0) to the vote, and the next step's issue
# (SYNCS.PHASECHK / WARPGROUP.ARRIVE / the IGMMAs). Usage: python3 ncu_regions.py ncu-main-sass.csv.xz ...
import csv, io, lzma, sys
def load(p):
    rows = list(csv.reader(io.StringIO(lzma.open(p, "rt").read())))
    i = next(k for k, r in enumerate(rows) if r and r[0] == "Address")
    h = rows[i]; return h, [r for r in rows[i + 1:] if len(r) == len(h)]
for p in sys.argv[1:]:
    h, rs = load(p)
    ci = {n: k for k, n in enumerate(h)}
    reasons = [n for n in h if n.startswith("stall_") and "(Not Issued)" not in n]
    num = lambda r, n: float(r[ci[n]] or 0) if r[ci[n]] not in ("-", "") else 0.0
    tot = {n: sum(num(r, n) for r in rs) for n in reasons}
    all_s = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rs)
    print(f"== {p}: {len(rs)} SASS rows, {all_s:.0f} samples, {sum(num(r,'Instructions Executed') for r in rs):.0f} warp instructions")
    print("  whole kernel, top reasons:", ", ".join(f"{n[6:]} {tot[n]/all_s:.3f}" for n in sorted(tot, key=tot.get, reverse=True)[:8]))
    reg = {"shift": [], "gmma_issue": [], "depbar0": [], "vote": []}
    for k, r in enumerate(rs):
        s = r[ci["Source"]]
        if "SHF.R.S64" in s: reg["shift"].append(k)
        if "WARPGROUP.ARRIVE" in s or "IGMMA" in s or "SYNCS.PHASECHK" in s: reg["gmma_issue"].append(k)
        if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in s: reg["depbar0"].append(k)
        if "VOTE.ANY" in s: reg["vote"].append(k)
    for name, ks in reg.items():
        ss = sum(num(rs[k], "Warp Stall Sampling (All Samples)") for k in ks)
        ex = sum(num(rs[k], "Instructions Executed") for k in ks)
        top = sorted(reasons, key=lambda n: -sum(num(rs[k], n) for k in ks))[:4]
        print(f"  {name:11s} rows {len(ks):4d}: samples {ss:8.0f} ({ss/all_s:.3f}), executed {ex:12.0f};",
              ", ".join(f"{n[6:]} {sum(num(rs[k], n) for k in ks):.0f}" for n in top))
    # the instructions with the most samples
    top = sorted(range(len(rs)), key=lambda k: -num(rs[k], "Warp Stall Sampling (All Samples)"))[:25]
    for k in top:
        r = rs[k]; rr = sorted(reasons, key=lambda n: -num(r, n))[:2]
        print(f"   row {k:5d} {r[ci['Source']].strip()[:60]:60s} samples {num(r,'Warp Stall Sampling (All Samples)'):7.0f} exec {num(r,'Instructions Executed'):9.0f} ", ", ".join(f"{n[6:]} {num(r,n):.0f}" for n in rr))
