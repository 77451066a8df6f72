"""Context-parallel decode from Python: ``ferrattn.merge_states`` (the core's merge of softmax
states) on host tensors against attention over the whole sequence, and, where torch is
installed, ``ferrattn.context_parallel.context_parallel_attention`` over a gloo process group of
several processes (one rank with no keys)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ferrattn
from conftest import randn

# Partials and whole attention both computed in f32 with online softmax; the merge adds a few
# f32 roundings of the rescaling.
F32_TOL = 2e-6
# How long a process-group worker may take; a cold NVRTC kernel cache costs minutes on a GPU (below).
WORKER_TIMEOUT_S = 600


def _partials(q, k, v, cuts):
    """(O_r, LSE_r) of every slice ``cuts[r] .. cuts[r+1]``; an empty slice gives 0 and -inf."""
    os_, ls_ = [], []
    b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if hi == lo:
            os_.append(np.zeros((b, sq, hq, v.shape[-1]), np.float32))
            ls_.append(np.full((b, hq, sq), -np.inf, np.float32))
            continue
        o, l = ferrattn.attention(q, np.ascontiguousarray(k[:, lo:hi]), np.ascontiguousarray(v[:, lo:hi]), "exact", return_lse=True)
        os_.append(np.asarray(o))
        ls_.append(np.asarray(l))
    return np.stack(os_), np.stack(ls_)


@pytest.mark.parametrize("cuts", [[0, 77], [0, 40, 40, 77], [0, 1, 63, 64, 130], [0, 0, 0, 5]])
def test_merged_slices_equal_attention_over_the_whole_sequence(cuts):
    rng = np.random.default_rng(len(cuts))
    sk = cuts[-1]
    q = randn(rng, (2, 1, 8, 64))
    k = randn(rng, (2, sk, 2, 64))
    v = randn(rng, (2, sk, 2, 64))
    po, pl = _partials(q, k, v, cuts)
    whole_o, whole_l = ferrattn.attention(q, k, v, "exact", return_lse=True)
    for order in (None, list(range(len(cuts) - 1))[::-1]):
        o, l = ferrattn.merge_states(po, pl, order=order)
        np.testing.assert_allclose(np.asarray(o), np.asarray(whole_o), rtol=0, atol=F32_TOL)
        np.testing.assert_allclose(np.asarray(l), np.asarray(whole_l), rtol=F32_TOL, atol=F32_TOL)


def test_no_rank_saw_a_key_gives_zeros_and_neg_inf_and_outputs_go_where_asked():
    po = np.zeros((2, 1, 1, 3, 8), np.float16)
    pl = np.full((2, 1, 3, 1), -np.inf, np.float32)
    out = np.full((1, 1, 3, 8), np.nan, np.float16)
    out_lse = np.full((1, 3, 1), np.nan, np.float32)
    o, l = ferrattn.merge_states(po, pl, out=out, out_lse=out_lse)
    assert o is out and l is out_lse
    assert (out == 0).all() and out.dtype == np.float16
    assert np.isneginf(out_lse).all()


def test_bad_partials_raise_typed_errors_with_the_values():
    po = np.zeros((2, 1, 1, 3, 8), np.float32)
    with pytest.raises(ferrattn.Error, match=r"\[2, 1, 3, 1\]"):
        ferrattn.merge_states(po, np.zeros((2, 1, 1, 3), np.float32))
    with pytest.raises(ferrattn.Error, match="permutation"):
        ferrattn.merge_states(po, np.zeros((2, 1, 3, 1), np.float32), order=[0, 0])
    with pytest.raises(ferrattn.Error):
        ferrattn.merge_states(po[0], np.zeros((1, 3, 1), np.float32))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# f16 on CUDA: each partial O is rounded to f16 before the merge and the output once more, so
# the comparison with single-GPU Lean is at f16's output tolerance (core's Tolerance::output).
F16_TOL = 1e-2


@pytest.mark.parametrize(
    "device,cuts", [("cpu", [0, 64]), ("cpu", [0, 50, 50, 77]), ("cuda", [0, 1000]), ("cuda", [0, 700, 1300])]
)
def test_context_parallel_attention_over_a_process_group_equals_whole_attention(tmp_path, device, cuts):
    torch = pytest.importorskip("torch", reason="torch.distributed is needed for the process group")
    world = len(cuts) - 1
    if device == "cuda" and torch.cuda.device_count() < world:
        pytest.skip(f"{world} GPUs needed, {torch.cuda.device_count()} present")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world),
               CP_CUTS=",".join(map(str, cuts)), CP_OUT=str(tmp_path), CP_DEVICE=device)
    worker = Path(__file__).with_name("cp_worker.py")
    procs = [subprocess.Popen([sys.executable, str(worker)], env=dict(env, RANK=str(r))) for r in range(world)]
    # A worker on a GPU compiles its kernels through NVRTC when the kernel cache is cold: that took more than
    # 120 s on an H100 (twenty-first session), so the wait only guards against a hang.
    assert [p.wait(timeout=WORKER_TIMEOUT_S) for p in procs] == [0] * world
    first = None
    for r in range(world):
        z = np.load(tmp_path / f"rank{r}.npz")
        tol = F32_TOL if device == "cpu" else F16_TOL
        np.testing.assert_allclose(z["o"], z["wo"], rtol=0, atol=tol)
        np.testing.assert_allclose(z["lse"], z["wl"], rtol=1e-5, atol=1e-5)
        if first is None:
            first = z["o"]
        assert (z["o"] == first).all(), "every rank merges in the same order: the same bits"


def _cuda_torch():
    from conftest import cuda_available

    if not cuda_available():
        pytest.skip("needs torch with a CUDA GPU")
    import torch

    return torch


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_merge_states_on_cuda_tensors_runs_on_the_device_and_equals_the_host_merge(dtype):
    torch = _cuda_torch()
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(5)
    r, b, sq, h, d = 3, 2, 2, 8, 128
    po = torch.randn((r, b, sq, h, d), generator=gen).to(dt)
    pl = torch.randn((r, b, h, sq), generator=gen) * 4
    pl[1, 0, :3, 0] = float("-inf")  # rank 1 saw no key on three rows
    order = [2, 0, 1]
    want_o, want_l = ferrattn.merge_states(po.float().numpy(), pl.numpy(), order=order)
    want_o, want_l = torch.from_numpy(np.asarray(want_o)), torch.from_numpy(np.asarray(want_l))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # the caller's current stream is the one used
        o, l = ferrattn.merge_states(po.cuda(), pl.cuda(), order=order)
    side.synchronize()
    assert o.is_cuda and o.dtype == dt and o.shape == (b, sq, h, d)
    assert l.is_cuda and l.dtype == torch.float32 and l.shape == (b, h, sq)
    u = 2.0**-11 if dtype == "float16" else 2.0**-8
    err = (o.float().cpu() - want_o).abs()
    bound = 2 * u * torch.maximum(o.float().cpu().abs(), want_o.abs()) + 1e-6
    assert (err <= bound).all(), f"max error {err.max().item()}"
    torch.testing.assert_close(l.cpu(), want_l, rtol=1e-5, atol=1e-5)
    # into the caller's tensors
    out = torch.full((b, sq, h, d), float("nan"), dtype=dt, device="cuda")
    out_lse = torch.full((b, h, sq), float("nan"), device="cuda")
    o2, l2 = ferrattn.merge_states(po.cuda(), pl.cuda(), order=order, out=out, out_lse=out_lse)
    assert o2 is out and l2 is out_lse
    assert torch.equal(out, o) and torch.equal(out_lse, l)


def test_bad_cuda_partials_raise_typed_errors_before_any_launch():
    torch = _cuda_torch()
    po = torch.zeros((2, 1, 1, 3, 8), dtype=torch.float16, device="cuda")
    with pytest.raises(ferrattn.Error, match=r"\[2, 1, 3, 1\]"):
        ferrattn.merge_states(po, torch.zeros((2, 1, 1, 3), device="cuda"))
    with pytest.raises(ferrattn.Error, match="permutation"):
        ferrattn.merge_states(po, torch.zeros((2, 1, 3, 1), device="cuda"), order=[0, 0])
    with pytest.raises(ferrattn.Error, match="rank 4"):
        ferrattn.merge_states(po[0], torch.zeros((1, 3, 1), device="cuda"))
    with pytest.raises(ferrattn.Error, match="f16, bf16"):
        ferrattn.merge_states(po.float(), torch.zeros((2, 1, 3, 1), device="cuda"))


@pytest.mark.parametrize("device,cuts", [("cpu", [0, 320]), ("cpu", [0, 128, 320]), ("cuda", [0, 320]), ("cuda", [0, 128, 320])])
def test_turbo_caches_of_slices_merge_across_a_group_like_the_whole_cache(tmp_path, device, cuts):
    """TurboAttention over context parallelism from Python: each rank's TurboCache holds its slice
    (64-token boundaries), its decode's (O, LSE) merged across the group with ``merge_across``.
    TurboAttention quantises P per slice, so the merged result keeps the whole cache's accuracy,
    not its bits: its error against exact attention is within 10% of the whole-cache decode's;
    with one rank it is the whole-cache decode bit for bit; every rank holds the same bits."""
    torch = pytest.importorskip("torch", reason="torch.distributed is needed for the process group")
    world = len(cuts) - 1
    if device == "cuda" and torch.cuda.device_count() < world:
        pytest.skip(f"{world} GPUs needed, {torch.cuda.device_count()} present")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE=str(world),
               CP_CUTS=",".join(map(str, cuts)), CP_OUT=str(tmp_path), CP_DEVICE=device, CP_ALGO="turbo")
    worker = Path(__file__).with_name("cp_worker.py")
    procs = [subprocess.Popen([sys.executable, str(worker)], env=dict(env, RANK=str(r))) for r in range(world)]
    assert [p.wait(timeout=WORKER_TIMEOUT_S) for p in procs] == [0] * world
    rms = lambda a, b: float(np.sqrt(np.mean((a - b) ** 2)))
    first = None
    for r in range(world):
        z = np.load(tmp_path / f"rank{r}.npz")
        err, whole = rms(z["o"], z["ex"]), rms(z["wo"], z["ex"])
        assert err <= 1.1 * whole, f"rank {r}: error {err:.3e} against exact, whole cache {whole:.3e}"
        if world == 1:
            assert (z["o"] == z["wo"]).all() and (z["lse"] == z["wl"]).all()
        if first is None:
            first = z["o"]
        assert (z["o"] == first).all(), "every rank merges in the same order: the same bits"
