"""Shared helpers of the Python tests: inputs, a float64 numpy reference, a comparator that
explains failures, and the Rust CLI as the second, independent way to run the CPU emulation.

The CLI (``ferrattn run --input x.safetensors --output o.safetensors``) reads and writes
safetensors through the Rust facade's own IO, so a binding result equal to it bit for bit shows
that the DLPack read, the f32 conversion and the write-back lose nothing. Its path comes from
``FERRATTN_CLI``, else ``target/debug/ferrattn`` or ``target/release/ferrattn`` of the checkout;
tests that need it are skipped (saying why) where it is not built.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ferrattn

ROOT = Path(__file__).resolve().parents[2]


def randn(rng, shape, dtype=np.float32, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def reference(q, k, v, causal=False, scale=None, seqlens_k=None):
    """Exact attention in float64. q [B,Sq,Hq,D], k [B,Sk,Hk,D], v [B,Sk,Hk,Dv] -> (o, lse);
    bottom-right causal mask; rows with no key get o = 0, lse = -inf."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    g = hq // hk
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    o = np.zeros((b, sq, hq, v.shape[3]))
    lse = np.full((b, hq, sq), -np.inf)
    for bi in range(b):
        n = sk if seqlens_k is None else int(seqlens_k[bi])
        for h in range(hq):
            s = q[bi, :, h] @ k[bi, :n, h // g].T * scale
            if causal:
                i = np.arange(sq)[:, None]
                j = np.arange(n)[None, :]
                s = np.where(j <= i + n - sq, s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            ok = np.isfinite(m[:, 0])
            p = np.where(ok[:, None], np.exp(s - np.where(ok[:, None], m, 0)), 0.0)
            l = p.sum(axis=1)
            o[bi, ok, h] = (p[ok] / l[ok, None]) @ v[bi, :n, h // g]
            lse[bi, h, ok] = np.log(l[ok]) + m[ok, 0]
    return o, lse


class Comparison:
    def __init__(self, got, want):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        assert got.shape == want.shape, f"shape {got.shape} vs {want.shape}"
        same_inf = np.array_equal(np.isinf(got), np.isinf(want)) and np.array_equal(
            np.isnan(got), np.isnan(want)
        )
        assert same_inf, "non-finite values in different places"
        f = np.isfinite(want)
        g, w = got[f], want[f]
        diff = np.abs(g - w)
        self.max_abs = float(diff.max(initial=0.0))
        self.where = np.unravel_index(int(np.argmax(np.where(f, np.abs(got - want), -1))), got.shape) if diff.size else None
        nw = np.linalg.norm(w)
        self.rel_fro = float(np.linalg.norm(g - w) / nw) if nw > 0 else float(np.linalg.norm(g))
        ng = np.linalg.norm(g)
        self.cosine = float(g @ w / (ng * nw)) if ng > 0 and nw > 0 else 1.0

    def __repr__(self):
        return f"max_abs {self.max_abs:.3e} at {self.where}, rel_fro {self.rel_fro:.3e}, cosine {self.cosine:.6f}"


def compare(got, want):
    return Comparison(got, want)


# --- safetensors, enough of the format for the CLI: 8-byte little-endian header length, JSON
# header with dtype/shape/data_offsets, then the raw little-endian bytes

_ST = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int32): "I32"}
_NP = {v: k for k, v in _ST.items()}


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": _ST[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a : 8 + n + b], dtype=_NP[meta["dtype"]]).reshape(meta["shape"])
    return out


def cli_path():
    env = os.environ.get("FERRATTN_CLI")
    if env:
        return Path(env)
    for p in (ROOT / "target" / "debug" / "ferrattn", ROOT / "target" / "release" / "ferrattn"):
        if p.exists():
            return p
    return None


@pytest.fixture
def cli(tmp_path):
    """Runs the Rust CLI's CPU emulation on numpy inputs and returns its (o, lse)."""
    exe = cli_path()
    if exe is None or not exe.exists():
        pytest.skip("the ferrattn CLI is not built (cargo build -p ferrattn-cli, or set FERRATTN_CLI)")

    def run(algo, q, k, v, causal=False, scale=None, seqlens_k=None):
        inp, outp = tmp_path / "x.safetensors", tmp_path / "o.safetensors"
        t = {"q": q, "k": k, "v": v}
        if seqlens_k is not None:
            t["seqlens_k"] = np.asarray(seqlens_k, dtype=np.int32)
        write_safetensors(inp, t)
        cmd = [str(exe), "run", "--algo", algo, "--backend", "cpu", "--input", str(inp), "--output", str(outp), "--no-check"]
        if causal:
            cmd.append("--causal")
        if scale is not None:
            cmd += ["--scale", repr(float(scale))]
        # the CPU plans size their schedules by the threads rayon sees (DeviceCaps::cpu): give the
        # CLI the thread count this process's rayon pool sees, so both make the same plan
        env = dict(os.environ, RAYON_NUM_THREADS=str(ferrattn.cpu_threads()))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
        o = read_safetensors(outp)
        return o["o"], o["lse"]

    return run


def have(module):
    try:
        __import__(module)
        return True
    except Exception:
        return False


def cuda_available():
    if not have("torch"):
        return False
    import torch

    return torch.cuda.is_available()


@pytest.fixture(autouse=True)
def current_cuda_device_is_left_alone(request):
    """No ferrattn call may change the caller's current CUDA device: an engine's allocations
    follow it. No-op without CUDA, and for ``test_interop.py``, whose other frameworks (jax, cupy)
    initialise CUDA runtimes of their own: on 2 x H200 (2026-11-23, c7d632c) jax's first use made
    cuda:0 current. In that run cuda:1 was already current when the first checked test began
    (docs/DEVICE_PATH.md, "Paged decode reads its page table a stage ahead"), so whatever set it
    ran before any test body; that origin is still open."""
    if not cuda_available() or request.node.module.__name__.endswith("test_interop"):
        yield
        return
    import torch

    before = torch.cuda.current_device()
    yield
    after = torch.cuda.current_device()
    assert after == before, f"the current CUDA device moved from cuda:{before} to cuda:{after}"
