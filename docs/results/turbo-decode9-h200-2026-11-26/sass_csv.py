#!/usr/bin/env python3
"""Summarise an `ncu --page source --csv --print-source sass` export: columns, totals, the top
SASS lines by warp-stall samples, and samples by opcode."""
import csv, sys, re, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
# find header row (contains 'Source')
hi = next(i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r))
hdr = rows[hi]; data = [r for r in rows[hi + 1:] if len(r) == len(hdr)]
print("columns:", hdr)
def col(name):
    for i, h in enumerate(hdr):
        if h.strip() == name: return i
    for i, h in enumerate(hdr):
        if name.lower() in h.lower(): return i
    return None
src = col("Source"); samp = col("Warp Stall Sampling (All Samples)"); ni = col("Warp Stall Sampling (Not-issued Samples)")
ex = col("Instructions Executed")
def num(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
tot = sum(num(r[samp]) for r in data) if samp is not None else 0
print(f"lines {len(data)} samples {tot:.0f} inst_executed {sum(num(r[ex]) for r in data) if ex is not None else 0:.0f}")
top = sorted(data, key=lambda r: -num(r[samp]))[:40]
for r in top:
    print(f"{num(r[samp]):8.0f} {100*num(r[samp])/max(tot,1):5.1f}% ni {num(r[ni]) if ni is not None else 0:8.0f} ex {num(r[ex]) if ex is not None else 0:10.0f}  {r[0][:8]} {r[src].strip()[:90]}")
by = collections.Counter(); byx = collections.Counter()
for r in data:
    op = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip()).split(" ")[0].split(".")[0]
    by[op] += num(r[samp]); byx[op] += num(r[ex]) if ex is not None else 0
print("by opcode (samples %, executed):")
for op, v in by.most_common(25):
    print(f"  {op:12s} {100*v/max(tot,1):5.1f}%  {byx[op]:12.0f}")
# stall-reason columns, if any
sc = [i for i, h in enumerate(hdr) if h.lower().startswith("stall") or "stall_" in h.lower()]
if sc:
    print("stall reason columns totals:")
    for i in sorted(sc, key=lambda i: -sum(num(r[i]) for r in data))[:20]:
        print(f"  {hdr[i]:50s} {sum(num(r[i]) for r in data):10.0f}")
