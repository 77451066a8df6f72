"""Context-parallel decode with a ``torch.distributed`` process group.

Each rank holds a slice of every sequence's keys (ragged across ranks; a rank may hold none).
``attention_partial`` computes the rank's partial state ``(O_r, LSE_r)`` through ferrattn;
``context_parallel_attention`` gathers the partials of every rank with the group's collective
(gloo on the CPU, NCCL on CUDA tensors) and ``merge_states`` merges them with ferrattn's merge
of softmax states (LeanAttention appendix D across ranks; ``ferrattn_core::cp``), so the result is
attention over the whole sequence within f32 rounding of the merge order.

``merge_states`` runs where its tensors are: host tensors through the core's merge, CUDA tensors
(f16/bf16 partials) through ferrattn's merge kernel on the caller's current stream, without a
copy or a synchronisation. ferrattn's own NCCL exchange and the planner that splits sequences by
bandwidth and picks all-gather or reduce-scatter by heads live in the Rust crate
(``ferrattn_cuda::cp``); from Python the exchange is the process group's all-gather.
"""

from __future__ import annotations

from . import _ferrattn as _native
from . import _tensors as _t
from ._api import attention, _finish


def merge_states(o, lse, *, order=None, out=None, out_lse=None, stream=None):
    """Merges per-rank partials ``o [R, B, Sq, H, D]`` (normalised) and ``lse [R, B, H, Sq]``
    (float32, natural log, ``-inf`` where the rank saw no key), folding ranks in ``order``
    (default ``0 .. R-1``). Returns ``(O [B, Sq, H, D], LSE [B, H, Sq])``, O in o's dtype; a row
    no rank saw comes out as zeros and ``-inf``.

    Host tensors (any float dtype) merge on the CPU. CUDA tensors (float16/bfloat16 ``o``, all
    contiguous) merge on the device, on the caller's current stream (or ``stream``), into
    ``out``/``out_lse`` or tensors allocated through the caller's framework."""
    if _t.device_of(o)[0] == _t.DL_CUDA:
        return _merge_states_cuda(o, lse, order, out, out_lse, stream)
    oc, lc = _t.export(o, None, True), _t.export(lse, None, True)
    outs = [None if x is None else _t.export(x, None, True) for x in (out, out_lse)]
    mo, ml = _native.merge_states(oc, lc, None if order is None else list(order), outs[0], outs[1])
    return _finish(o, out, mo), _finish(o, out_lse, ml)


def _merge_states_cuda(o, lse, order, out, out_lse, stream):
    # a partial tensor of the wrong rank gets empty outputs: the native check names o's rank
    r, b, sq, h, d = o.shape if len(o.shape) == 5 else (0,) * 5
    if out is None:
        out = _t.empty_device(o, (b, sq, h, d))
    if out_lse is None:
        out_lse = _t.empty_device(o, (b, h, sq), "float32")
    handle = _t.current_stream(o, stream)
    own = stream is None
    caps = [_t.export(x, handle, own) for x in (o, lse, out, out_lse)]
    _native.merge_states(
        caps[0], caps[1], None if order is None else list(order), caps[2], caps[3], handle
    )
    return out, out_lse


def attention_partial(q, k, v, *, softmax_scale=None, algo="lean"):
    """This rank's partial state: ``(O_r [B, Sq, Hq, D], LSE_r [B, Hq, Sq])`` of ``q`` over the
    local ``k``/``v`` ``[B, S_local, Hk, D]`` (non-causal: decode, every local key is in the
    past). A rank with no key (``S_local == 0``) returns zeros and ``-inf``, which merge to
    nothing."""
    if k.shape[1] == 0:
        import torch

        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        o = torch.zeros((b, sq, hq, v.shape[-1]), dtype=q.dtype, device=q.device)
        lse = torch.full((b, hq, sq), float("-inf"), dtype=torch.float32, device=q.device)
        return o, lse
    return attention(q, k, v, algo, False, softmax_scale, True)


def context_parallel_attention(q, k_local, v_local, group=None, *, softmax_scale=None, algo="lean"):
    """Attention of ``q [B, Sq, Hq, D]`` (the same on every rank) over the keys of all ranks of
    ``group``, each holding ``k_local``/``v_local`` ``[B, S_r, Hk, D]``: the partial through
    ferrattn, an all-gather of ``(O_r, LSE_r)`` over the group, ferrattn's merge. Every rank
    returns the same ``(O [B, Sq, Hq, D], LSE [B, Hq, Sq])`` (ranks merged in rank order)."""
    o, lse = attention_partial(q, k_local, v_local, softmax_scale=softmax_scale, algo=algo)
    return merge_across(o, lse, group)


def merge_across(o, lse, group=None):
    """Attention over the keys of every rank of ``group`` from each rank's own partial state
    ``(o [B, Sq, H, D], lse [B, H, Sq])`` (torch tensors): an all-gather of the partials over the
    group, then ``merge_states`` in rank order (on the device for CUDA f16/bf16 partials). Any
    decode that returns its LSE gives such a partial: ``attention_partial``, or a
    ``TurboCache`` holding this rank's slice of each sequence (``cache.decode(q)``; its 64-token
    blocks should not straddle the slice boundaries). Every rank returns the same bits."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    os_ = [torch.empty_like(o) for _ in range(world)]
    ls_ = [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(os_, o.contiguous(), group=group)
    dist.all_gather(ls_, lse.contiguous(), group=group)
    go, gl = torch.stack(os_), torch.stack(ls_)
    if go.is_cuda and go.dtype not in (torch.float16, torch.bfloat16):
        # the device merge has f16/bf16 kernels; f32 partials merge on the host
        mo, ml = merge_states(go.cpu(), gl.cpu())
        return mo.to(o.device), ml.to(o.device)
    return merge_states(go, gl)
