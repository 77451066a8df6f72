"""A Llama-3-8B-shape decode step of 32 layers as one CUDA graph: ferrattn's paged Lean against
torch SDPA (cuDNN and FlashAttention backends), all three captured and replayed in the same run.

Shape: 32 query heads, 8 KV heads, head dim 128, fp16, one query token per sequence, batch
1-16, context 1k-32k (every sequence of a row at the full context).

Memory, shared by both sides so they read the same bytes: per layer one K and one V buffer
``[B, ctx, 8, 128]``. ferrattn reads them as a page pool ``[B * ctx / 16, 16, 8, 128]`` (pages
of 16 tokens, the page table in order, as vLLM's allocator mostly hands pages out); SDPA reads
them as ``[B, 8, ctx, 128]`` (a transposed view, last axis contiguous) with the 4 query heads of
each KV head as the query rows (``q [B, 8, 4, 128]``), so K/V are read once, as a GQA decode
kernel reads them (``scripts/bench_sdpa.py`` does the same). Where 32 layers of K/V do not fit
in ``KV_BUDGET`` bytes, the layers cycle over as many buffers as fit (at least 2); every such
buffer is at least 1 GiB, 20x the 50 MB L2, so no layer finds the previous one's K/V in cache.

Timing: each side's 32-layer step is captured once in a CUDA graph (after a warm-up on the
capture stream); ``REPLAYS`` replays are timed between CUDA events, ``REPEATS`` times; the
median per step is reported (and p10/p90). Correctness in the same run: layer 0's output of
each SDPA backend against ferrattn's (max abs difference; both fp16).

Prints one JSON object on stdout (a one-line summary per row on stderr).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import ferrattn

LAYERS, HQ, HK, D, PAGE = 32, 32, 8, 128, 16
BATCHES = (1, 4, 16)
CONTEXTS = (1024, 8192, 32768)
KV_BUDGET = 40 << 30
REPLAYS, REPEATS = 10, 9


def pick(xs, q):
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * q)]


def time_graph(step):
    """Median, p10, p90 microseconds per call of ``step`` captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
        step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(REPEATS):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(REPLAYS):
            g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / REPLAYS)
    del g
    return {"median_us": pick(ts, 0.5), "p10_us": pick(ts, 0.1), "p90_us": pick(ts, 0.9)}


def row(b, ctx, dev):
    per_layer = 2 * b * ctx * HK * D * 2
    nbuf = max(2, min(LAYERS, KV_BUDGET // per_layer))
    g = torch.Generator(device=dev).manual_seed(b * 100003 + ctx)
    kv = []
    for _ in range(nbuf):
        k = torch.empty(b, ctx, HK, D, dtype=torch.float16, device=dev).uniform_(-2, 2, generator=g)
        v = torch.empty(b, ctx, HK, D, dtype=torch.float16, device=dev).uniform_(-2, 2, generator=g)
        kv.append((k, v))
    qs = [torch.empty(b, HQ, D, dtype=torch.float16, device=dev).uniform_(-2, 2, generator=g) for _ in range(LAYERS)]
    r = {"batch": b, "ctx": ctx, "kv_buffers": nbuf, "kv_bytes_per_step": per_layer * LAYERS}

    # ferrattn: paged Lean, planned once for the step, run per layer
    pages = ctx // PAGE
    table = [[s * pages + i for i in range(pages)] for s in range(b)]
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device=dev))
    w.plan(table, [ctx] * b, HQ, HK, D, PAGE, num_pages=b * pages, q_data_type=torch.float16)
    pools = [(k.view(b * pages, PAGE, HK, D), v.view(b * pages, PAGE, HK, D)) for k, v in kv]
    outs = [torch.empty(b, HQ, D, dtype=torch.float16, device=dev) for _ in range(LAYERS)]
    lses = [torch.empty(b, HQ, dtype=torch.float32, device=dev) for _ in range(LAYERS)]

    def lean_step():
        for l in range(LAYERS):
            w.run(qs[l], pools[l % nbuf], out=outs[l], lse=lses[l])

    r["ferrattn_lean_paged16"] = time_graph(lean_step)
    lean_step()
    torch.cuda.synchronize()
    lean0 = outs[0].clone()

    # torch SDPA: the query heads of a KV head as the query rows of an MHA call over the KV heads
    sq = [q.view(b, HK, HQ // HK, D) for q in qs]
    skv = [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in kv]
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        res = [None] * LAYERS

        def sdpa_step():
            for l in range(LAYERS):
                k, v = skv[l % nbuf]
                res[l] = F.scaled_dot_product_attention(sq[l], k, v)

        try:
            with sdpa_kernel(be):
                r[f"sdpa_{name}"] = time_graph(sdpa_step)
                sdpa_step()
            torch.cuda.synchronize()
            got = res[0].reshape(b, HQ, D)
            r[f"sdpa_{name}"]["max_abs_diff_vs_ferrattn"] = (got.float() - lean0.float()).abs().max().item()
        except Exception as e:  # a backend that refuses a shape is reported, not fatal
            r[f"sdpa_{name}_error"] = str(e).splitlines()[0][:200]
        del res
    lean_us = r["ferrattn_lean_paged16"]["median_us"]
    best = [r[f"sdpa_{n}"]["median_us"] for n in ("cudnn", "flash") if f"sdpa_{n}" in r]
    if best:
        r["speedup_vs_best_sdpa"] = min(best) / lean_us
    r["ferrattn_tbs"] = r["kv_bytes_per_step"] / (lean_us * 1e-6) / 1e12
    del kv, pools, skv, w
    torch.cuda.empty_cache()
    return r


def main():
    dev = torch.device("cuda")
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "ferrattn_commit": ferrattn.GIT_COMMIT,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "shape": {"layers": LAYERS, "heads_q": HQ, "heads_kv": HK, "head_dim": D, "dtype": "float16", "page_size": PAGE},
        "method": f"one CUDA graph per side and row; {REPLAYS} replays between CUDA events, median of {REPEATS}",
        "rows": [],
    }
    for b in BATCHES:
        for ctx in CONTEXTS:
            t0 = time.time()
            try:
                r = row(b, ctx, dev)
            except Exception as e:  # out of memory and the like: reported, the rest still runs
                r = {"batch": b, "ctx": ctx, "error": str(e).splitlines()[0][:200]}
                torch.cuda.empty_cache()
            r["wall_s"] = round(time.time() - t0, 2)
            out["rows"].append(r)
            brief = {k: (round(v["median_us"], 1) if isinstance(v, dict) and "median_us" in v else v) for k, v in r.items()}
            print(json.dumps(brief), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
