#!/usr/bin/env python3
"""PyTorch SDPA (cuDNN and flash) decode timings for the shapes the Rust TurboQuant benchmark
(`benches/turboquant.rs`) ran, in the same command, and the comparison table.

Usage: turboquant_sdpa.py turboquant.json sdpa.json > table.md

Decode: fp16, one query token per sequence, run as MHA over the KV heads with the GQA group as
the query length (K/V read once, as a GQA decode kernel does), over an fp16 cache of the same
length; values uniform in [-2, 2). Timing: batches of calls replayed from a CUDA graph between
CUDA events after warm-up, median time per call (eager calls if capture fails).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def time_ms(fn):
    fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    est = max(s.elapsed_time(e), 0.002)
    per_batch = int(min(200, max(3, 2.0 / est)))
    batches = int(min(25, max(5, 200.0 / (est * per_batch))))
    try:
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for _ in range(per_batch):
                fn()
        run = g.replay
    except Exception:
        torch.cuda.synchronize()

        def run():
            for _ in range(per_batch):
                fn()

    run()
    ts = []
    for _ in range(batches):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / per_batch)
    return median(ts)


BACKENDS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))


def main():
    rust = json.load(open(sys.argv[1]))
    dev = torch.device("cuda")
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "decode": []}
    seen = {}
    for r in rust["decode"]:
        key = (r["batch"], r["ctx"], r["hq"], r["hk"], r["d"])
        if key in seen:
            continue
        B, ctx, hq, hk, d = key
        q = torch.empty(B, hk, hq // hk, d, device=dev, dtype=torch.float16).uniform_(-2, 2)
        k = torch.empty(B, hk, ctx, d, device=dev, dtype=torch.float16).uniform_(-2, 2)
        v = torch.empty(B, hk, ctx, d, device=dev, dtype=torch.float16).uniform_(-2, 2)
        t = {}
        for name, be in BACKENDS:
            try:
                with sdpa_kernel(be):
                    t[name] = time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
            except Exception as ex:  # a backend that refuses a shape is reported, not fatal
                t[name] = None
                t[name + "_error"] = str(ex).splitlines()[0][:160]
        seen[key] = t
        res["decode"].append({"batch": B, "ctx": ctx, "hq": hq, "hk": hk, "d": d, **t})
        print(f"sdpa decode {key}: {t}", file=sys.stderr)
        del q, k, v
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[2], "w"))

    def fmt(x):
        return "n/a" if x is None else f"{x:.4f}"

    def ratio(a, b):
        return "n/a" if a is None or b is None else f"{a / b:.2f}x"

    copy = rust["copy_gbs"]
    print(f"## TurboQuant decode on {rust['device']} vs PyTorch {torch.__version__} SDPA and our Lean (commit {rust.get('commit', '?')})\n")
    print(f"ms per decode step (one query token, all layers' work of one layer); GB/s = compressed bytes read / time, copy ceiling {copy:.0f} GB/s; "
          "floor = compressed bytes / copy ceiling; best SDPA = the faster of cuDNN and flash over fp16.\n")
    print("| B x ctx | d | config | fp16 KV GB | turboquant | floor | GB/s | % copy | lean fp16 | cuDNN | flash | vs best SDPA | vs lean |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rust["decode"]:
        s = seen[(r["batch"], r["ctx"], r["hq"], r["hk"], r["d"])]
        best = min([x for x in (s.get("cudnn"), s.get("flash")) if x is not None], default=None)
        gbs = r["cache_bytes"] / (r["ms"] * 1e-3) / 1e9
        floor = r["cache_bytes"] / (copy * 1e9) * 1e3
        print(f"| {r['batch']} x {r['ctx']} | {r['d']} | {r['config']} | {r['fp16_bytes'] / 1e9:.2f} | {fmt(r['ms'])} | {fmt(floor)} | {gbs:.0f} | {100 * gbs / copy:.0f}% "
              f"| {fmt(r.get('lean_ms'))} | {fmt(s.get('cudnn'))} | {fmt(s.get('flash'))} | {ratio(best, r['ms'])} | {ratio(r.get('lean_ms'), r['ms'])} |")
    print("\n### Compression (one append of the whole context, keys + values launches)\n")
    print("| B x ctx | d | config | ms | fp16 K/V read GB/s | % copy |")
    print("|---|---|---|---|---|---|")
    for c in rust["compress"]:
        gbs = c["fp16_bytes"] / (c["ms"] * 1e-3) / 1e9
        print(f"| {c['batch']} x {c['ctx']} | {c['d']} | {c['config']} | {c['ms']:.3f} | {gbs:.0f} | {100 * gbs / copy:.1f}% |")
    errs = [(k, v) for rr in res["decode"] for k, v in rr.items() if k.endswith("_error")]
    for k, v in errs[:6]:
        print(f"\n{k}: {v}")


if __name__ == "__main__":
    main()
