"""``torch.library.custom_op`` registration, so ``torch.compile`` treats a ferrattn call as one
opaque op (with a fake implementation for shapes) instead of tracing into the DLPack exchange.

Registered the first time torch is imported alongside ferrattn (see ``ferrattn._lazy``), or by
calling :func:`register`. Ops:

* ``torch.ops.ferrattn.attention(q, k, v, algo, causal, softmax_scale) -> (out, lse)``
* ``torch.ops.ferrattn.attention_out(q, k, v, out, lse, algo, causal, softmax_scale) -> ()``
  (writes the caller's buffers)

On CUDA tensors these plan every call (a small host-to-device copy of the step's tables), so a
CUDA graph should capture ``BatchDecodeWithPagedKVCacheWrapper.run`` (planned outside the graph)
instead. Outside ``torch.compile`` tracing, :func:`ferrattn.attention` skips the dispatcher and
calls the native module directly (the dispatcher's Python wrapper costs microseconds per call).
"""

# no `from __future__ import annotations`: torch.library.custom_op reads the annotations as types

from typing import Optional, Tuple

from ._ferrattn import UnsupportedError

_REGISTERED = False
# set by register(): module globals that torch.compile's tracer can follow without imports
is_compiling = None
_ops = None


def registered():
    return _REGISTERED


def register():
    """Registers the ops (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    import torch
    from torch import Tensor

    from . import _api

    @torch.library.custom_op("ferrattn::attention", mutates_args=())
    def attention_op(
        q: Tensor, k: Tensor, v: Tensor, algo: str, causal: bool, softmax_scale: Optional[float]
    ) -> Tuple[Tensor, Tensor]:
        return _api._attention_direct(q, k, v, algo, causal, softmax_scale, True, None, None, None)

    @attention_op.register_fake
    def _(q, k, v, algo, causal, softmax_scale):
        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        return (
            q.new_empty((b, sq, hq, v.shape[-1])),
            q.new_empty((b, hq, sq), dtype=torch.float32),
        )

    @torch.library.custom_op("ferrattn::attention_out", mutates_args=("out", "lse"))
    def attention_out_op(
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        algo: str,
        causal: bool,
        softmax_scale: Optional[float],
    ) -> None:
        _api._attention_direct(q, k, v, algo, causal, softmax_scale, True, out, lse, None)

    @attention_out_op.register_fake
    def _(q, k, v, out, lse, algo, causal, softmax_scale):
        return None

    global is_compiling, _ops
    is_compiling = torch.compiler.is_compiling
    _ops = torch.ops.ferrattn
    _REGISTERED = True


def attention(q, k, v, algo, causal, softmax_scale, out=None, lse=None):
    """Through the dispatcher (what ``ferrattn.attention`` calls while torch.compile traces)."""
    if out is None and lse is None:
        return _ops.attention(q, k, v, algo, causal, softmax_scale)
    if out is None or lse is None:
        raise UnsupportedError("under torch.compile pass both out= and lse=, or neither")
    _ops.attention_out(q, k, v, out, lse, algo, causal, softmax_scale)
    return out, lse
