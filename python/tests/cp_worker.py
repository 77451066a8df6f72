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
dist.init_process_group("gloo", rank=rank, world_size=world)
rng = np.random.default_rng(14)
b, sk, hq, hk, d = 2, cuts[-1], 8, 2, 64
q = torch.from_numpy(rng.standard_normal((b, 1, hq, d)).astype(np.float32))
k = torch.from_numpy(rng.standard_normal((b, sk, hk, d)).astype(np.float32))
v = torch.from_numpy(rng.standard_normal((b, sk, hk, d)).astype(np.float32))
lo, hi = cuts[rank], cuts[rank + 1]
o, lse = context_parallel_attention(q, k[:, lo:hi].contiguous(), v[:, lo:hi].contiguous())
wo, wl = ferrattn.attention(q, k, v, "lean", return_lse=True)
np.savez(os.path.join(os.environ["CP_OUT"], f"rank{rank}.npz"), o=o.numpy(), lse=lse.numpy(), wo=wo.numpy(), wl=wl.numpy())
dist.destroy_process_group()
sys.exit(0)
