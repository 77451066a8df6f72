#!/usr/bin/env python3
"""A public TurboQuant decode kernel timed beside ours (issue 10: "where you can run it beside ours
without committing it").

Usage: bench_peer_turboquant.py PEER.py jobs.json out.json

PEER.py is a module kept OUTSIDE the repository (git-ignored `.peers/`, see docs/TURBOQUANT_CUDA.md
"A public TurboQuant decode in the same run") that defines vLLM's launcher
`triton_turboquant_decode_attention(query, kv_cache, block_table, seq_lens, Pi, centroids, scale,
mse_bits, key_packed_size, value_quant_bits, PiT=..., mid_o_buf=..., output_buf=..., lse_buf=...,
max_num_kv_splits=...)` over vLLM's combined cache `[num_blocks, block_size, Hk, padded_slot]` u8
(key: MSE codes, fp16 norm; value: uniform codes, fp16 scale and zero; slot rounded up to a power
of two). Nothing of it is in this file.

jobs.json is the file `scripts/bench_sdpa.py` takes (its `method` and its decode jobs); every job is
timed with the same `measure` (warm-up, batches of calls captured in a CUDA graph, median), over
`sets` copies of the cache, each paged with pages of 16 in a shuffled order. Configuration k4-v3:
4-bit MSE keys without QJL, 3-bit values (vLLM's `tq_k4v3`), the closest to ours of its kinds.
Before timing, batch 1 of each job's shape at a short context is checked against a torch reference
of the same cache (the peer must be right before its time means anything).
"""
import importlib.util
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sdpa import measure  # noqa: E402

MSE_BITS, VALUE_BITS, PAGE = 4, 3, 16


def layout(d):
    mse = math.ceil(d * MSE_BITS / 8)
    kps = mse + 2  # codes, fp16 norm
    vdb = math.ceil(d * VALUE_BITS / 8)
    slot = kps + vdb + 4  # codes, fp16 scale, fp16 zero
    return mse, kps, vdb, slot, 1 << (slot - 1).bit_length()


def make_cache(b, ctx, hk, d, dev, gen):
    """A filled pool, its shuffled page table and the lengths. Codes uniform; norms, scales and zeros
    valid fp16 so the softmax sees finite scores."""
    mse, kps, vdb, slot, padded = layout(d)
    pages = -(-ctx // PAGE)
    n = b * pages
    cache = torch.randint(0, 256, (n, PAGE, hk, padded), dtype=torch.uint8, device=dev, generator=gen)

    def put(off, vals):
        cache[..., off:off + 2] = vals.to(torch.float16).view(torch.uint8).view(n, PAGE, hk, 2)

    put(mse, torch.empty(n, PAGE, hk, device=dev).uniform_(0.5, 1.5, generator=gen))
    put(kps + vdb, torch.full((n, PAGE, hk), 0.1, device=dev))
    put(kps + vdb + 2, torch.full((n, PAGE, hk), -0.35, device=dev))
    table = torch.randperm(n, device=dev, generator=gen).to(torch.int32).view(b, pages)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=dev)
    return cache, table, lens


def reference(q, cache, table, lens, pi, cents, scale, d):
    """softmax(norm * <q Pi^T, c[idx]> * scale) . (idx * s + z), one sequence at a time (batch 1)."""
    mse, kps, vdb, slot, _ = layout(d)
    hq, hk = q.shape[1], cache.shape[2]
    ctx = int(lens[0])
    rows = cache[table[0].long()].reshape(-1, hk, cache.shape[-1])[:ctx].to(torch.int64)  # [ctx, hk, slot]

    def bits(data, nbits, count):
        out = torch.zeros(data.shape[:-1] + (count,), dtype=torch.int64, device=data.device)
        for i in range(count):
            off = i * nbits
            word = data[..., off // 8] | (data[..., min(off // 8 + 1, data.shape[-1] - 1)] << 8)
            out[..., i] = (word >> (off % 8)) & ((1 << nbits) - 1)
        return out

    def f16(x):
        return (x[..., 0] | (x[..., 1] << 8)).to(torch.int16).view(torch.float16).float()

    k = cents[bits(rows[..., :mse], MSE_BITS, d)] * f16(rows[..., mse:mse + 2])[..., None]
    v = bits(rows[..., kps:kps + vdb], VALUE_BITS, d).float() * f16(rows[..., kps + vdb:kps + vdb + 2])[..., None] \
        + f16(rows[..., kps + vdb + 2:kps + vdb + 4])[..., None]
    qr = q[0].float() @ pi.T  # [hq, d]
    g = hq // hk
    out = torch.empty(hq, d, device=q.device)
    for h in range(hq):
        s = (k[:, h // g] @ qr[h]) * scale
        out[h] = torch.softmax(s, 0) @ v[:, h // g]
    return out


def main():
    spec = importlib.util.spec_from_file_location("peer_tq", sys.argv[1])
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    req = json.load(open(sys.argv[2]))
    m = req["method"]
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(2026)
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "peer": os.path.basename(sys.argv[1]),
           "config": "k4-v3 (4-bit MSE keys, no QJL; 3-bit uniform values)", "page": PAGE, "results": []}
    checked = set()
    for j in req["jobs"]:
        if j["kind"] != "decode" or j["sq"] != 1:
            continue
        b, hq, hk, d, ctx = j["batch"], j["hq"], j["hk"], j["d"], j["ctx"]
        dt = torch.float16 if j["dtype"] == "f16" else torch.bfloat16
        mse, kps, vdb, slot, padded = layout(d)
        pi, _ = torch.linalg.qr(torch.randn(d, d, device=dev, generator=gen))
        pit = pi.T.contiguous()
        cents = torch.linspace(-2.5, 2.5, 1 << MSE_BITS, device=dev) / math.sqrt(d)
        scale = 1.0 / math.sqrt(d)
        splits = 32
        r = {"job": j, "slot_bytes": slot, "padded_slot_bytes": padded, "splits": splits}
        if (hq, hk, d) not in checked:  # correctness first, at a short context
            checked.add((hq, hk, d))
            q = torch.empty(1, hq, d, device=dev, dtype=dt).uniform_(-2, 2, generator=gen)
            cache, table, lens = make_cache(1, 1000, hk, d, dev, gen)
            got = peer.triton_turboquant_decode_attention(q, cache, table, lens, pi, cents, scale, MSE_BITS, kps,
                                                          VALUE_BITS, PiT=pit, max_num_kv_splits=splits).float()
            want = reference(q, cache, table, lens, pi, cents, scale, d)
            r["check_max_abs_err"] = float((got[0] - want).abs().max())
            r["check_ref_max_abs"] = float(want.abs().max())
        sets = []
        for _ in range(j["sets"]):
            q = torch.empty(b, hq, d, device=dev, dtype=dt).uniform_(-2, 2, generator=gen)
            cache, table, lens = make_cache(b, ctx, hk, d, dev, gen)
            sets.append((q, cache, table, lens))
        mid = torch.empty(b, hq, splits, d + 1, dtype=torch.float32, device=dev)
        out = torch.empty(b, hq, d, dtype=dt, device=dev)
        lse = torch.empty(b, hq, dtype=torch.float32, device=dev)

        def fn(i):
            q, cache, table, lens = sets[i]
            peer.triton_turboquant_decode_attention(q, cache, table, lens, pi, cents, scale, MSE_BITS, kps, VALUE_BITS,
                                                    PiT=pit, mid_o_buf=mid, output_buf=out, lse_buf=lse,
                                                    max_num_kv_splits=splits)

        try:
            r["peer"] = measure(m, fn, len(sets))
            t = r["peer"]["median_ms"] * 1e-3
            r["cache_bytes_read"] = b * ctx * hk * padded
            r["gbs"] = r["cache_bytes_read"] / t / 1e9
        except Exception as e:  # reported, not fatal
            r["peer_error"] = str(e).splitlines()[0][:200]
        print(f"peer B={b} ctx={ctx} {hq}/{hk} d{d} {j['dtype']}: "
              f"{round(r['peer']['median_ms'] * 1e3, 1) if 'peer' in r else r.get('peer_error')} us"
              f"{'' if 'check_max_abs_err' not in r else ' check %.2e of %.2e' % (r['check_max_abs_err'], r['check_ref_max_abs'])}",
              file=sys.stderr)
        res["results"].append(r)
        del sets
        torch.cuda.empty_cache()
    json.dump(res, open(sys.argv[3], "w"), indent=1)


if __name__ == "__main__":
    main()
