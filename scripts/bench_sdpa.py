#!/usr/bin/env python3
"""PyTorch baselines and ceilings for `ferrattn bench` (compiled into the binary; run by it).

Usage: bench_sdpa.py jobs.json out.json

jobs.json holds the timing method (cli/src/bench/timing.rs `Method`, the one method of the suite) and
the jobs: decode (one query token; GQA run as MHA over the KV heads with the group of query heads
as the query rows, so K/V are read once as a GQA kernel reads them; ragged batches padded to the
longest sequence, which is all SDPA can do) and prefill (K/V expanded from Hk to Hq heads: every
backend takes MHA). Inputs are uniform in [-2, 2) as the Rust rows' device fill, `sets` copies
rotated. Each backend (cuDNN, FlashAttention) is timed as the Rust rows are: warm-up, one call
to size the batches, batches of calls captured in a CUDA graph and replayed between CUDA events
(eager back-to-back calls if capture fails), median and 10th/90th percentiles per call.

Also measured: an eager 1 GiB device-to-device copy (read + write), a bf16 and an INT8 GEMM of
8192^3, and a one-element kernel replayed from a graph (the launch floor).
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def pick(xs, q):
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * q)]


def measure(m, fn, sets, graph=True):
    """fn(i) runs one call on input set i; returns the suite's Timing record."""
    for i in range(m["warmup"]):
        fn(i % sets)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn(0)
    e.record()
    e.synchronize()
    est = max(s.elapsed_time(e), 0.002)
    # about warmup_ms more of untimed calls (the suite's Method::warmup_ms): the clocks are up
    # before anything is timed, as on the ferrattn side
    if m.get("warmup_ms", 0) > 0:
        for i in range(int(min(5000, -(-m["warmup_ms"] // est)))):
            fn(i % sets)
        s.record()
        fn(0)
        e.record()
        e.synchronize()
        est = max(s.elapsed_time(e), 0.002)
    per_batch = int(min(m["max_per_batch"], max(m["min_per_batch"], m["batch_ms"] / est)))
    batches = int(min(m["max_batches"], max(m["min_batches"], m["budget_ms"] / (est * per_batch))))
    clock = "graph-replay"
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
        run()
    except Exception:
        torch.cuda.synchronize()
        clock = "device-events"
        counter = [0]

        def run():
            for _ in range(per_batch):
                fn(counter[0] % sets)
                counter[0] += 1

    ts = []
    for _ in range(batches):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        run()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / per_batch)
    return {"median_ms": pick(ts, 0.5), "p10_ms": pick(ts, 0.1), "p90_ms": pick(ts, 0.9),
            "batches": len(ts), "per_batch": per_batch, "sets": sets, "clock": clock}


def ceilings(m, dev):
    out = {}
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev).random_(0, 255)
    b = torch.empty_like(a)
    t = measure(m, lambda i: b.copy_(a), 1, graph=False)
    out["copy_gbs_torch"] = 2 * (1 << 30) / (t["median_ms"] * 1e-3) / 1e9
    del a, b
    n = 8192
    x = torch.empty(n, n, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    y = torch.empty(n, n, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    t = measure(m, lambda i: torch.mm(x, y), 1)
    out["gemm_bf16_tflops"] = 2 * n**3 / (t["median_ms"] * 1e-3) / 1e12
    del x, y
    try:
        xi = torch.randint(-127, 127, (n, n), dtype=torch.int8, device=dev)
        yi = torch.randint(-127, 127, (n, n), dtype=torch.int8, device=dev)
        t = measure(m, lambda i: torch._int_mm(xi, yi), 1)
        out["gemm_int8_tops"] = 2 * n**3 / (t["median_ms"] * 1e-3) / 1e12
        del xi, yi
    except Exception as e:  # no INT8 GEMM in this torch: the INT8 rows use the bf16 rate
        print(f"int8 GEMM unavailable: {str(e).splitlines()[0][:160]}", file=sys.stderr)
    one = torch.zeros(1, dtype=torch.float32, device=dev)
    t = measure(m, lambda i: one.add_(1.0), 1)
    out["launch_floor_us"] = t["median_ms"] * 1e3
    torch.cuda.empty_cache()
    return out


def inputs(j, dev):
    dt = torch.float16 if j["dtype"] == "f16" else torch.bfloat16
    B, hq, hk, d, ctx, sq = j["batch"], j["hq"], j["hk"], j["d"], j["ctx"], j["sq"]
    sets = []
    for _ in range(j["sets"]):
        if j["kind"] == "decode":
            g = hq // hk
            # [B, 1, Hk*g, D] viewed as [B, Hk, g, D]: the query heads of a KV head as rows
            q = torch.empty(B, hk, g, d, device=dev, dtype=dt).uniform_(-2, 2)
            k = torch.empty(B, ctx, hk, d, device=dev, dtype=dt).uniform_(-2, 2).transpose(1, 2)
            v = torch.empty(B, ctx, hk, d, device=dev, dtype=dt).uniform_(-2, 2).transpose(1, 2)
        else:
            q = torch.empty(B, hq, sq, d, device=dev, dtype=dt).uniform_(-2, 2)
            k = torch.empty(B, hk, ctx, d, device=dev, dtype=dt).uniform_(-2, 2).repeat_interleave(hq // hk, dim=1)
            v = torch.empty(B, hk, ctx, d, device=dev, dtype=dt).uniform_(-2, 2).repeat_interleave(hq // hk, dim=1)
        sets.append((q, k, v))
    return sets


def main():
    req = json.load(open(sys.argv[1]))
    m = req["method"]
    dev = torch.device("cuda")
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "ceilings": ceilings(m, dev), "results": []}
    print(f"torch {torch.__version__} ceilings: {res['ceilings']}", file=sys.stderr)
    for j in req["jobs"]:
        r = {}
        try:
            xs = inputs(j, dev)
        except Exception as e:  # out of memory for a padded batch: reported, not fatal
            r["cudnn_error"] = r["flash_error"] = str(e).splitlines()[0][:200]
            xs = []
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            if not xs:
                break
            try:
                with sdpa_kernel(be):
                    fn = lambda i: F.scaled_dot_product_attention(*xs[i], is_causal=j["causal"])
                    r[name] = measure(m, fn, len(xs))
            except Exception as e:  # a backend that refuses a shape is reported, not fatal
                r[name + "_error"] = str(e).splitlines()[0][:200]
        med = {n: round(r[n]["median_ms"], 4) for n in ("cudnn", "flash") if n in r}
        print(f"sdpa {j['kind']} B={j['batch']} sq={j['sq']} ctx={j['ctx']} {j['hq']}/{j['hk']} d{j['d']} {j['dtype']}: {med}", file=sys.stderr)
        res["results"].append(r)
        del xs
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
