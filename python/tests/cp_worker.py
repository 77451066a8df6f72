"""One rank of the torch.distributed context-parallel test (test_cp.py starts one process per
rank): the same seeded inputs on every rank, this rank's slice of the keys, the result and the
whole-sequence attention written to ``$CP_OUT/rank<r>.npz``."""

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

import ferrattn
from ferrattn.context_parallel import context_parallel_attention

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
cuts = [int(x) for x in os.environ["CP_CUTS"].split(",")]  # world + 1 cut points
cuda = os.environ.get("CP_DEVICE") == "cuda"  # NCCL group, one GPU per rank, f16 Lean on CUDA
if cuda:
    torch.cuda.set_device(rank)
dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
rng = np.random.default_rng(14)
b, sk, hq, hk, d = 2, cuts[-1], 8, 2, 64
dt, dev = (torch.float16, f"cuda:{rank}") if cuda else (torch.float32, "cpu")
t = lambda shape: torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to(dev, dt)
q, k, v = t((b, 1, hq, d)), t((b, sk, hk, d)), t((b, sk, hk, d))
lo, hi = cuts[rank], cuts[rank + 1]
h = lambda x: x.float().cpu().numpy()
out = os.path.join(os.environ["CP_OUT"], f"rank{rank}.npz")
if os.environ.get("CP_ALGO") == "turbo":
    # TurboAttention: this rank's slice in its own INT4 cache (prompt queries are zeros: only the
    # cache the prefill writes is used), its decode's (O, LSE) merged across the group; the same
    # decode over a cache of the whole sequence, and exact attention, for the accuracy check
    def turbo(kk, vv):
        cache = ferrattn.TurboCache(b, hk, d, kv_bits="int4")
        zq = torch.zeros((b, kk.shape[1], hq, d), dtype=dt, device=dev)
        cache.prefill(zq, kk.contiguous(), vv.contiguous(), causal=False)
        return cache.decode(q)
    o, lse = ferrattn.context_parallel.merge_across(*turbo(k[:, lo:hi], v[:, lo:hi]))
    wo, wl = turbo(k, v)
    ex = ferrattn.attention(q, k, v, "lean" if cuda else "exact")
    np.savez(out, o=h(o), lse=h(lse), wo=h(wo), wl=h(wl), ex=h(ex))
else:
    o, lse = context_parallel_attention(q, k[:, lo:hi].contiguous(), v[:, lo:hi].contiguous())
    wo, wl = ferrattn.attention(q, k, v, "lean", return_lse=True)
    np.savez(out, o=h(o), lse=h(lse), wo=h(wo), wl=h(wl))
dist.destroy_process_group()
sys.exit(0)
