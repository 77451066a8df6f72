#!/usr/bin/env python3
"""Joins the Rust Lean bench (lean.json) and the SDPA timings (sdpa.json) of one run into
markdown tables and a summary of the issue's targets. An optional third file is a second run of
the Lean bench in the same command, shown beside the first as run-to-run spread.
Usage: gpu-report.py lean.json sdpa.json [lean_rerun.json]"""
import json
import sys


def main():
    lean = json.load(open(sys.argv[1]))
    sdpa = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else {"records": []}
    rerun = json.load(open(sys.argv[3]))["records"] if len(sys.argv) > 3 else []
    peak = lean["copy_gbs"]
    key = lambda r: (r["table"], r["batch"], r["hq"], r["hk"], r["d"], r["max_ctx"], round(r["mean_ctx"]))
    sd = {key(r): r for r in sdpa["records"]}
    rr = {key(r): r for r in rerun}
    lines = [
        f"device: {lean['device']} ({lean['sms']} SMs, L2 {lean['l2_bytes'] >> 20} MiB); commit {lean.get('commit') or '?'}; "
        f"torch {sdpa.get('torch', '?')}; measured copy ceiling {peak:.0f} GB/s (read+write, 2 GiB; torch 1 GiB: {sdpa.get('copy_gbs_torch', 0):.0f})",
        f"kernels: {lean['kernels']}",
    ]
    misses = []
    for table in ("lean", "llama", "ragged"):
        rows = [r for r in lean["records"] if r["table"] == table]
        if not rows:
            continue
        lines.append("")
        lines.append(f"### {table}")
        lines.append("| B | Hq/Hk | d | ctx max | ctx mean | KV MB | lean us (CTAs) | rerun us | GB/s | % peak | full-grid us | fixed us (splits) | SDPA cuDNN us | SDPA flash us | vs best SDPA | vs fixed |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            s = sd.get(key(r), {})
            gbs = r["kv_bytes"] / (r["lean_ms"] * 1e-3) / 1e9
            cands = [x for x in (s.get("cudnn_ms"), s.get("flash_ms")) if x]
            best = min(cands) if cands else None
            vs_sdpa = best / r["lean_ms"] if best else None
            vs_fixed = r["fixed_ms"] / r["lean_ms"]
            f = lambda x: f"{x * 1000:.1f}" if x else "n/a"
            pad = " (padded)" if s.get("padded") else ""
            lines.append(
                f"| {r['batch']} | {r['hq']}/{r['hk']} | {r['d']} | {r['max_ctx']} | {r['mean_ctx']:.0f} | {r['kv_bytes'] / 1e6:.1f} | {r['lean_ms'] * 1000:.1f} ({r['lean_ctas']}) | {f(rr.get(key(r), {}).get('lean_ms'))} | {gbs:.0f} | {100 * gbs / peak:.0f}% | {r.get('full_grid_ms', r['lean_ms']) * 1000:.1f} | "
                f"{r['fixed_ms'] * 1000:.1f} ({r['fixed_splits']}) | {f(s.get('cudnn_ms'))}{pad} | {f(s.get('flash_ms'))}{pad} | "
                f"{(f'{vs_sdpa:.2f}x' if vs_sdpa else 'n/a')} | {vs_fixed:.2f}x |"
            )
            name = f"{table} B={r['batch']} ctx={r['max_ctx']}"
            if vs_sdpa is not None and vs_sdpa < 1 / 1.05 and not s.get("padded"):
                misses.append(f"{name}: {1 / vs_sdpa:.2f}x slower than the faster SDPA (target: never >5% slower)")
            if table != "ragged" and r["batch"] == 1 and r["max_ctx"] <= 32768 and vs_sdpa is not None and vs_sdpa < 2:
                misses.append(f"{name}: {vs_sdpa:.2f}x vs SDPA at batch 1 (target >= 2x at ctx <= 32k)")
            if r["kv_bytes"] >= 256e6 and gbs < 0.85 * peak:
                misses.append(f"{name}: {100 * gbs / peak:.0f}% of peak with {r['kv_bytes'] / 1e6:.0f} MB of KV (target >= 85%)")
            if table == "ragged" and abs(r["mean_ctx"] / r["max_ctx"] - 0.25) < 0.08 and vs_fixed < 1.5:
                misses.append(f"{name} mean/max={r['mean_ctx'] / r['max_ctx']:.2f}: {vs_fixed:.2f}x vs fixed split (target >= 1.5x at 25%)")
        for r in rows:
            s = sd.get(key(r), {})
            for n in ("cudnn", "flash"):
                if s.get(n + "_error"):
                    lines.append(f"- SDPA {n} refused B={r['batch']} ctx={r['max_ctx']}: {s[n + '_error']}")
                    break
    lines.append("")
    lines.append("### targets missed" if misses else "### all targets met")
    lines += [f"- {m}" for m in misses]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
