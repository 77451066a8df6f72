#!/usr/bin/env python3
"""Static per-tile instruction count of one decode_body call site of a turbo decode kernel.

usage: sass_tile_count.py DISASM KERNEL SITE_LINES [COLD_LINES]
  DISASM      output of `nvdisasm -gi -c` on a cubin built with -lineinfo
  KERNEL      e.g. turbo_decode_g4_bf16_d128
  SITE_LINES  comma-separated lines of turbo_decode.cu in decode_body (the call sites, e.g. the
              `case 1: unit_qk_folded<D, 4>` line)
  COLD_LINES  comma-separated source lines (any depth of the inline chain) whose instructions are
              off the hot path (e.g. the expf branch, the exact-division fallback, the mask)

Counts the SASS instructions whose inline chain has the site as its decode_body call site, in the
kernel's main body only (before the first BRA.DIV target: the out-of-line tail holds the
diverged-warp shuffle fallbacks), minus those under a cold line. For straight-line sites (the
folded q K^T and P V, the cp.async issues) this equals the executed count per tile; checked on
the kernel of main against the Nsight source counters of docs/results/turbo-decode2-h100-2026-11-25
(call2-sass-hot-int4.txt.xz): 350 / 348.6 (q K^T folded 4-bit), 411 / 409.4 (P V), 82 / 79.7 and
57 / 54.4 (issues). The softmax site over-counts by about 38 (its rescale exponential runs only
when a row maximum moves): 402 static against 364.4 executed.
"""
import re, sys

dis, kern = sys.argv[1], sys.argv[2]
sites = {int(x) for x in sys.argv[3].split(",")}
cold = {int(x) for x in sys.argv[4].split(",")} if len(sys.argv) > 4 and sys.argv[4] else set()
lines = open(dis).read().split("\n")
start = next(i for i, l in enumerate(lines) if l.startswith(".text.%s:" % kern))
pend, chain, ins, labels, label = [], [], [], {}, None
for l in lines[start + 1 :]:
    if l.startswith(".text.") or l.startswith("//----"):
        break
    m = re.match(r"^(\.L_x_\d+):", l)
    if m:
        label = m.group(1)
        continue
    m = re.match(r'\s*//## File "([^"]+)", line (\d+)', l)
    if m:
        pend.append(int(m.group(2)))
        continue
    m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*)", l)
    if m:
        if pend:
            chain, pend = pend, []
        idx = int(m.group(1), 16) // 16
        if label:
            labels[label], label = idx, None
        ins.append((idx, m.group(2).strip(), chain))
div_targets = {t for _, s, _ in ins for t in re.findall(r"BRA\.DIV \w+, `\((\.L_x_\d+)\)", s)}
end = min((labels[t] for t in div_targets), default=1 << 30)
count = {s: 0 for s in sites}
for idx, _, ch in ins:
    if idx < end and len(ch) >= 2 and ch[-2] in sites and not any(x in cold for x in ch[:-2]):
        count[ch[-2]] += 1
print("kernel %s: %d SASS instructions; per-tile hot count by site: %s (sum %d)" % (kern, len(ins), count, sum(count.values())))
