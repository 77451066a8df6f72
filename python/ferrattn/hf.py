"""Registration with Hugging Face transformers' ``AttentionInterface``, so a model runs on
ferrattn with ``attn_implementation="ferrattn_exact"`` (or ``ferrattn_lean``, ``ferrattn_turbo``).

transformers calls ``fn(module, query, key, value, attention_mask, scaling=..., dropout=...,
is_causal=..., **kwargs)`` with ``[batch, heads, seq, head_dim]`` tensors (K and V not repeated
for GQA) and expects ``([batch, seq, heads, head_dim], weights)`` back. Each name is also
registered with ``AttentionMaskInterface`` as SDPA's mask builder, which hands over ``None``
whenever the mask is the plain causal one (no padding); the causal mask is then applied by
ferrattn, bottom-right aligned, which is what decoding against a KV cache needs. A padding mask
is not supported and raises ``UnsupportedError``.

``ferrattn_lean`` runs LeanAttention for decode steps (at most 8 query tokens); Lean is a decode
kernel, so longer queries (the prompt) run exact attention: ferrattn's on host tensors, torch's
``scaled_dot_product_attention`` on CUDA tensors (ferrattn's device path has no exact prefill).
``ferrattn_turbo`` on CUDA tensors runs a ``TurboCache`` per attention layer through the device
path (INT4 blocks on every KV head: the paper's mixed 2/4 split picks heads from host statistics
of the prompt, which the device path does not copy to the host): the prompt is a prefill that
compresses K/V into the layer's cache, and each decode step appends the step's tokens to it and
decodes against it, as ``attention(algo="turbo")`` does with ``Sq < Sk`` (the keys before the
step compressed, then the step's tokens appended and decoded one at a time). A step whose cache
does not hold exactly the keys before it (a new sequence, a rewound cache) rebuilds the cache
from the keys transformers hands over. ``ferrattn_exact`` runs host tensors (its CUDA device
path does not exist and it raises ``UnsupportedError`` on CUDA tensors).
"""

from __future__ import annotations

NAMES = {"ferrattn_exact": "exact", "ferrattn_lean": "lean", "ferrattn_turbo": "turbo"}
_REGISTERED = False


def _forward_for(algo):
    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, is_causal=None, **kwargs):
        from . import _api
        from ._ferrattn import UnsupportedError

        if dropout:
            raise UnsupportedError(f"attention dropout {dropout}; ferrattn runs inference only (dropout 0)")
        if attention_mask is not None:
            raise UnsupportedError(
                "an explicit attention mask (padding); ferrattn applies the causal mask itself "
                "and supports batches without padding"
            )
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        if q.is_cuda:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        causal = bool(causal) and q.shape[1] > 1
        if algo == "turbo" and q.is_cuda:
            return _turbo_cuda(module, q, k, v, causal, scaling), None
        if algo == "lean" and q.shape[1] > 8:
            if q.is_cuda:
                return _sdpa_prompt(query, key, value, causal, scaling), None
            out = _api.attention(q, k, v, algo="exact", causal=causal, softmax_scale=scaling)
        else:
            out = _api.attention(q, k, v, algo=algo, causal=causal, softmax_scale=scaling)
        return out, None

    forward.__name__ = f"ferrattn_{algo}_attention_forward"
    return forward


def _turbo_cuda(module, q, k, v, causal, scale):
    """TurboAttention on CUDA tensors ``[B, S, H, D]`` through the layer's ``TurboCache``."""
    import torch

    from . import _api

    b, sq, hq, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    cache = getattr(module, "_ferrattn_turbo_cache", None)
    if sq == sk:
        # the prompt: Alg. 1, and its keys and values compressed into a fresh cache
        cache = _api.TurboCache(b, hk, d, kv_bits="int4")
        module._ferrattn_turbo_cache = cache
        out, _ = cache.prefill(q, k, v, causal=causal, softmax_scale=scale)
        return out
    ctx = sk - sq
    fresh = cache is None or cache.batch != b or cache.heads_kv != hk or cache.head_dim != d
    if fresh or any(cache.seq_len(i) != ctx for i in range(b)):
        # rebuild from the keys before the step (their queries are not needed: the prefill's
        # output is dropped, only its cache is kept)
        cache = _api.TurboCache(b, hk, d, kv_bits="int4")
        module._ferrattn_turbo_cache = cache
        z = torch.zeros(b, ctx, hq, d, dtype=q.dtype, device=q.device)
        cache.prefill(z, k[:, :ctx].contiguous(), v[:, :ctx].contiguous(), causal=True, softmax_scale=scale)
    out = torch.empty_like(q)

    def token(x, i):  # one token of every sequence, dense (the device path reads dense rows)
        return x[:, i : i + 1].contiguous()

    if not causal:
        # every query sees every key: the whole step goes in first
        for i in range(sq):
            cache.append(token(k, ctx + i), token(v, ctx + i))
    for i in range(sq):
        if causal:
            cache.append(token(k, ctx + i), token(v, ctx + i))
        o, _ = cache.decode(token(q, i), softmax_scale=scale)
        out[:, i : i + 1] = o
    return out


def _sdpa_prompt(query, key, value, causal, scale):
    """torch SDPA for a Lean model's prompt on CUDA, with ferrattn's bottom-right causal mask."""
    import torch

    lq, lk = query.shape[2], key.shape[2]
    mask = None
    if causal and lq != lk:
        mask = torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(lk - lq)
    o = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=causal and lq == lk, scale=scale, enable_gqa=True
    )
    return o.transpose(1, 2)


def registered():
    return _REGISTERED


def register():
    """Registers the three names (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface

    try:
        from transformers import AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask
    except ImportError:  # transformers before the mask interface (< 4.53)
        AttentionMaskInterface = sdpa_mask = None
    for name, algo in NAMES.items():
        AttentionInterface.register(name, _forward_for(algo))
        if AttentionMaskInterface is not None:
            AttentionMaskInterface.register(name, sdpa_mask)
    _REGISTERED = True
