"""A Llama-3-8B-shape decode step of 32 layers as one CUDA graph: ferrattn's paged Lean and its
TurboQuant compressed cache against torch SDPA over fp16 (cuDNN and FlashAttention backends),
all captured and replayed in the same run.

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

TurboQuant (``ferrattn_turboquant``): every buffer's K/V compressed once into a
``ferrattn.TurboQuantCache`` (4-bit keys with the QJL sign sketch, 3-bit values, float16
norms: about 4.3x fewer bytes than fp16), one per buffer, the layers cycling over them as the
other sides do; the step is the 32 layers' ``decode`` (one query token per sequence), captured
in one graph after an eager step left each cache's tables in its workspace. Its layer 0 is
compared with ferrattn's exact Lean output (relative Frobenius error: the quantisation's, not
a bug's). ``DECODE_GRAPH_ROWS`` (e.g. ``4x8192,16x8192``) picks rows; ``DECODE_GRAPH_TURBOQUANT=0``
leaves TurboQuant out.

Timing: each side's 32-layer step is captured once in a CUDA graph (after a warm-up on the
capture stream); ``REPLAYS`` replays are timed between CUDA events, ``REPEATS`` times; the
median per step is reported (and p10/p90). Correctness in the same run: layer 0's output of
each SDPA backend against ferrattn's (max abs difference; both fp16).

Prints one JSON object on stdout (a one-line summary per row on stderr).
"""

from __future__ import annotations

import json
import os
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
TURBOQUANT = os.environ.get("DECODE_GRAPH_TURBOQUANT", "1") != "0"
TQ_KEY_BITS, TQ_VALUE_BITS = 4, 3


def rows_to_run():
    """(batch, ctx) pairs: ``DECODE_GRAPH_ROWS`` ("BxCTX,...") or every BATCHES x CONTEXTS."""
    env = os.environ.get("DECODE_GRAPH_ROWS", "").strip()
    if not env:
        return [(b, c) for b in BATCHES for c in CONTEXTS]
    return [tuple(int(x) for x in r.split("x")) for r in env.split(",") if r]


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
    if TURBOQUANT:
        # ferrattn TurboQuant: each buffer's K/V compressed once; the layers' decodes in one graph
        caches = []
        for k, v in kv:
            c = ferrattn.TurboQuantCache(b, HK, D, key_bits=TQ_KEY_BITS, value_bits=TQ_VALUE_BITS, max_tokens=ctx)
            c.append(k, v)
            caches.append(c)
        tq_q = [q.view(b, 1, HQ, D) for q in qs]
        tq_o = [torch.empty(b, 1, HQ, D, dtype=torch.float16, device=dev) for _ in range(LAYERS)]
        tq_l = [torch.empty(b, HQ, 1, dtype=torch.float32, device=dev) for _ in range(LAYERS)]

        def tq_step():
            for l in range(LAYERS):
                caches[l % nbuf].decode(tq_q[l], out=tq_o[l], lse=tq_l[l])

        try:
            r["ferrattn_turboquant"] = time_graph(tq_step)
            tq_step()
            torch.cuda.synchronize()
            got, want = tq_o[0].reshape(b, HQ, D).float(), lean0.float()
            r["ferrattn_turboquant"]["rel_fro_vs_lean"] = ((got - want).norm() / want.norm()).item()
            r["turboquant_bytes_per_step"] = sum(caches[l % nbuf].memory()["compressed_bytes"] for l in range(LAYERS))
            r["turboquant_config"] = {"key_bits": TQ_KEY_BITS, "value_bits": TQ_VALUE_BITS, "key_qjl": True, "compress": caches[0].compress}
        except Exception as e:  # reported, not fatal
            r["ferrattn_turboquant_error"] = str(e).splitlines()[0][:200]
        del caches
    lean_us = r["ferrattn_lean_paged16"]["median_us"]
    best = [r[f"sdpa_{n}"]["median_us"] for n in ("cudnn", "flash") if f"sdpa_{n}" in r]
    if best:
        r["speedup_vs_best_sdpa"] = min(best) / lean_us
    r["ferrattn_tbs"] = r["kv_bytes_per_step"] / (lean_us * 1e-6) / 1e12
    if "ferrattn_turboquant" in r:
        tq_us = r["ferrattn_turboquant"]["median_us"]
        r["turboquant_speedup_vs_lean"] = lean_us / tq_us
        if best:
            r["turboquant_speedup_vs_best_sdpa"] = min(best) / tq_us
        r["turboquant_tbs"] = r["turboquant_bytes_per_step"] / (tq_us * 1e-6) / 1e12
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
    for b, ctx in rows_to_run():
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
