"""Per-call overhead of the Python path over the Rust launch, on a GPU (torch tensors).

One layer of a Llama-3-8B-shape decode step (32 query heads, 8 KV heads, d 128, fp16, page 16)
for one sequence of 128 tokens: small enough that the host, not the GPU, sets the pace of
back-to-back launches. Three timings, each the median of ``REPEATS`` runs of ``CALLS``
back-to-back calls (fewer than the driver's launch queue holds, so no call waits for the GPU),
with a synchronisation between runs:

* ``rust_ns``: ``DecodeStep::run`` called from Rust in a loop (views built and checked, launch),
  what a Rust engine pays per layer (``PagedDecodePlan.rust_launch_ns``);
* ``python_ns``: ``BatchDecodeWithPagedKVCacheWrapper.run(q, (k, v), out=, lse=)`` from Python;
* ``gpu_ns``: the GPU time per call of the same loop (CUDA events), to show the host timings
  were not bounded by the GPU.

``overhead_ns = python_ns - rust_ns``. Prints one JSON object.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

import ferrattn
from ferrattn import _tensors as _t

CALLS = 200
REPEATS = 31


def main():
    dev = torch.device("cuda")
    page, seq, hq, hk, d = 16, 128, 32, 8, 128
    pages = seq // page
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(pages, page, hk, d, generator=g).half().to(dev)
    vc = torch.randn(pages, page, hk, d, generator=g).half().to(dev)
    q = torch.randn(1, hq, d, generator=g).half().to(dev)
    out = torch.empty(1, hq, d, dtype=torch.float16, device=dev)
    lse = torch.empty(1, hq, device=dev)
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8, device=dev))
    w.plan([list(range(pages))], [seq], hq, hk, d, page, num_pages=pages, q_data_type=torch.float16)
    for _ in range(50):
        w.run(q, (kc, vc), out=out, lse=lse)
    torch.cuda.synchronize()

    py = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(CALLS):
            w.run(q, (kc, vc), out=out, lse=lse)
        py.append((time.perf_counter_ns() - t0) / CALLS)
    torch.cuda.synchronize()

    handle = torch.cuda.current_stream().cuda_stream
    caps = [_t.export(x, handle) for x in (q, kc, vc, out, lse)]
    rust = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        rust.append(w._plan.rust_launch_ns(*caps, handle, CALLS))
    torch.cuda.synchronize()

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(5):
        torch.cuda.synchronize()
        start.record()
        for _ in range(CALLS):
            w.run(q, (kc, vc), out=out, lse=lse)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e6 / CALLS)

    # the one-shot contiguous call (plans, takes a workspace and launches every time): for
    # reference, not the engine path
    qc = q[:, None]
    k4, v4 = kc.reshape(1, seq, hk, d), vc.reshape(1, seq, hk, d)
    one = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        for _ in range(20):
            ferrattn.attention(qc, k4, v4, algo="lean")
        one.append((time.perf_counter_ns() - t0) / 20)

    r = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "problem": f"B=1 Hq={hq} Hk={hk} d={d} fp16, {seq} tokens in pages of {page}",
        "calls_per_run": CALLS,
        "runs": REPEATS,
        "rust_ns": statistics.median(rust),
        "python_ns": statistics.median(py),
        "overhead_ns": statistics.median(py) - statistics.median(rust),
        "gpu_ns": statistics.median(gpu),
        "python_ns_min": min(py),
        "rust_ns_min": min(rust),
        "attention_one_shot_ns": statistics.median(one),
    }
    print(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
