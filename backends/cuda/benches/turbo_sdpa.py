#!/usr/bin/env python3
"""PyTorch SDPA timings (cuDNN and FlashAttention backends) for the shapes the Rust TurboAttention
benchmark (`benches/turbo.rs`) ran, in the same command, and a comparison table.

Usage: turbo_sdpa.py turbo.json sdpa.json > table.md

Prefill: q [B, Hq, S, D] and K/V expanded from Hk to Hq heads (every backend takes MHA; the
work is that of GQA attention), bf16 as the Rust run, is_causal as the record says (Sq == Sk, so
top-left and bottom-right masks agree). Decode: fp16, one query token per sequence run as MHA
over the KV heads with the group of query heads as the query length (K/V read once, as a GQA
decode kernel does), against an fp16 cache of the same length. Values uniform in [-2, 2).
Timing: batches of calls replayed from a CUDA graph between CUDA events after warm-up, median
time per call (eager back-to-back calls if capture fails).
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
    mode = "graph"
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
        mode = "eager"

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
    return median(ts), mode


BACKENDS = (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))


def sdpa_times(q, k, v, causal):
    out = {}
    for name, be in BACKENDS:
        try:
            with sdpa_kernel(be):
                out[name] = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))[0]
        except Exception as e:  # a backend that refuses a shape is reported, not fatal
            out[name] = None
            out[name + "_error"] = str(e).splitlines()[0][:160]
    return out


def main():
    rust = json.load(open(sys.argv[1]))
    dev = torch.device("cuda")
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "prefill": [], "decode": []}
    for r in rust["prefill"]:
        B, S, hq, hk, d = r["batch"], r["len"], r["hq"], r["hk"], r["d"]
        dt = torch.bfloat16 if r["dtype"] == "bf16" else torch.float16
        q = torch.empty(B, hq, S, d, device=dev, dtype=dt).uniform_(-2, 2)
        k = torch.empty(B, hk, S, d, device=dev, dtype=dt).uniform_(-2, 2).repeat_interleave(hq // hk, dim=1)
        v = torch.empty(B, hk, S, d, device=dev, dtype=dt).uniform_(-2, 2).repeat_interleave(hq // hk, dim=1)
        t = sdpa_times(q, k, v, r["causal"])
        res["prefill"].append({**{x: r[x] for x in ("batch", "len", "causal")}, **t})
        print(f"sdpa prefill {B} x {S} causal {r['causal']}: {t}", file=sys.stderr)
        del q, k, v
        torch.cuda.empty_cache()
    seen = {}
    for r in rust["decode"]:
        key = (r["batch"], r["ctx"], r["hq"], r["hk"], r["d"])
        if key in seen:
            continue
        B, ctx, hq, hk, d = key
        g = hq // hk
        q = torch.empty(B, hk, g, d, device=dev, dtype=torch.float16).uniform_(-2, 2)
        k = torch.empty(B, hk, ctx, d, device=dev, dtype=torch.float16).uniform_(-2, 2)
        v = torch.empty(B, hk, ctx, d, device=dev, dtype=torch.float16).uniform_(-2, 2)
        seen[key] = sdpa_times(q, k, v, False)
        res["decode"].append({"batch": B, "ctx": ctx, "kv_bytes_fp16": 2 * k.numel() * 2, **seen[key]})
        print(f"sdpa decode {B} x {ctx}: {seen[key]}", file=sys.stderr)
        del q, k, v
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[2], "w"))

    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    def ratio(a, b):
        return "n/a" if a is None or b is None else f"{a / b:.2f}x"

    print(f"## TurboAttention on {rust['device']} vs PyTorch {torch.__version__} SDPA (commit {rust.get('commit', '?')})\n")
    if rust["prefill"]:
        prefill_table(rust, res, fmt, ratio)
    copy = rust.get("copy_gbs")
    print("\n### Decode (one token, 32 query / 8 KV heads, d 128); turbo over its compressed cache, SDPA over fp16; ms\n")
    print(f"Best SDPA = the faster of cuDNN and flash; GB/s = compressed cache bytes / turbo time (copy ceiling {copy:.0f} GB/s).\n")
    print("| B x ctx | fp16 KV GB | bits | schedule | turbo | cache MB | GB/s | cuDNN fp16 | flash fp16 | vs cuDNN | vs flash | vs best SDPA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rust["decode"]:
        s = seen[(r["batch"], r["ctx"], r["hq"], r["hk"], r["d"])]
        best = min([x for x in (s.get("cudnn"), s.get("flash")) if x is not None], default=None)
        gbs = r["cache_bytes"] / (r["ms"] * 1e-3) / 1e9
        print(f"| {r['batch']} x {r['ctx']} | {r['fp16_bytes'] / 1e9:.2f} | {r['bits']} | {r['schedule']} | {fmt(r['ms'])} | {r['cache_bytes'] / 1e6:.1f} | {gbs:.0f} "
              f"| {fmt(s.get('cudnn'))} | {fmt(s.get('flash'))} | {ratio(s.get('cudnn'), r['ms'])} | {ratio(s.get('flash'), r['ms'])} | {ratio(best, r['ms'])} |")
    errs = [(k, v) for rr in res["prefill"] + res["decode"] for k, v in rr.items() if k.endswith("_error")]
    for k, v in errs[:6]:
        print(f"\n{k}: {v}")


def prefill_table(rust, res, fmt, ratio):
    print("### Prefill (32 query / 8 KV heads, d 128, bf16); ms, speedup = SDPA time / turbo total\n")
    print("| B x S | causal | turbo total | turbo attention | turbo + cache | cuDNN | flash | vs cuDNN | vs flash |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r, s in zip(rust["prefill"], res["prefill"]):
        print(f"| {r['batch']} x {r['len']} | {r['causal']} | {fmt(r['total_ms'])} | {fmt(r['attention_ms'])} | {fmt(r['with_cache_ms'])} "
              f"| {fmt(s.get('cudnn'))} | {fmt(s.get('flash'))} | {ratio(s.get('cudnn'), r['total_ms'])} | {ratio(s.get('flash'), r['total_ms'])} |")


if __name__ == "__main__":
    main()
