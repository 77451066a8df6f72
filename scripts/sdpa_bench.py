#!/usr/bin/env python3
"""PyTorch SDPA decode timings (cuDNN and FlashAttention backends) for the configurations the
Rust Lean benchmark ran, in the same command, so that both are measured on one machine state.

Reads the Rust bench's JSON (`lean.json`), writes `sdpa.json` with one record per configuration.
Inputs use ferrattn's layout [B, S, H, D] viewed as [B, H, S, D] (SDPA's), values uniform in
[-2, 2) as the Rust fill. GQA decode (one query token) is run as MHA over the KV heads with the
group of query heads as the query length, which every SDPA backend supports and which reads K/V
once, as a GQA kernel does. Ragged batches have no varlen SDPA: they run padded to the longest
sequence (what SDPA can do), and are labelled so. Timing: CUDA events per call after warm-up,
median, input sets rotated when one set is smaller than 4x L2.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def time_ms(fn, sets, graph=True):
    """Milliseconds per call: batches of calls replayed from a CUDA graph (so Python's per-call
    overhead is not timed, as the Rust side enqueues launches back to back), median over batches.
    Falls back to eager back-to-back calls when capture fails."""
    for i in range(3):
        fn(i % sets)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(0)
    e.record()
    e.synchronize()
    est = max(s.elapsed_time(e), 0.002)
    per_batch = int(min(200, max(3, 2.0 / est)))
    batches = int(min(25, max(5, 200.0 / (est * per_batch))))
    run = None
    try:
        if not graph:
            raise RuntimeError("eager timing asked for")
        g = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(2):
                fn(i % sets)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(g):
            for i in range(per_batch):
                fn(i % sets)
        run = g.replay
        mode = "graph"
    except Exception:
        torch.cuda.synchronize()

        def run():
            for i in range(per_batch):
                fn(i % sets)

        mode = "eager"
    ts = []
    for _ in range(batches):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / per_batch)
    return median(ts), mode


def main():
    src, dst = sys.argv[1], sys.argv[2]
    cfg = json.load(open(src))
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    # copy ceiling through torch as a cross-check of the Rust one
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    copy_ms, _ = time_ms(lambda i: b.copy_(a), 1, graph=False)
    del a, b
    out = {"torch": torch.__version__, "device": props.name, "copy_gbs_torch": 2 * (1 << 30) / (copy_ms * 1e-3) / 1e9, "records": []}
    for r in cfg["records"]:
        B, hq, hk, d, mx = r["batch"], r["hq"], r["hk"], r["d"], r["max_ctx"]
        dt = torch.float16 if r["dtype"] == "f16" else torch.bfloat16
        g = hq // hk
        sets = r["sets"]
        qs, ks, vs = [], [], []
        for s in range(sets):
            q = torch.empty(B, 1, hq, d, device=dev, dtype=dt).uniform_(-2, 2)
            k = torch.empty(B, mx, hk, d, device=dev, dtype=dt).uniform_(-2, 2)
            v = torch.empty(B, mx, hk, d, device=dev, dtype=dt).uniform_(-2, 2)
            # [B, 1, Hk*g, D] -> [B, Hk, g, D]: the query heads of a KV head as query rows
            qs.append(q.view(B, hk, g, d))
            ks.append(k.transpose(1, 2))
            vs.append(v.transpose(1, 2))
        rec = {k2: r[k2] for k2 in ("table", "batch", "hq", "hk", "d", "dtype", "max_ctx", "mean_ctx")}
        rec["padded"] = r["mean_ctx"] < mx
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    fn = lambda i: F.scaled_dot_product_attention(qs[i], ks[i], vs[i])
                    rec[name + "_ms"], rec[name + "_timing"] = time_ms(fn, sets)
            except Exception as e:  # a backend that refuses a shape is reported, not fatal
                rec[name + "_ms"] = None
                rec[name + "_error"] = str(e).splitlines()[0][:200]
        print(f"sdpa {r['table']:6} B={B:3} ctx={mx:6} cudnn={rec.get('cudnn_ms')} flash={rec.get('flash_ms')}", file=sys.stderr)
        out["records"].append(rec)
        del qs, ks, vs
        torch.cuda.empty_cache()
    json.dump(out, open(dst, "w"))


if __name__ == "__main__":
    main()
