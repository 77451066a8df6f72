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
``ferrattn_exact`` and ``ferrattn_turbo`` run host tensors (their CUDA device path does not exist
yet and they raise ``UnsupportedError`` on CUDA tensors).
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
        if algo == "lean" and q.shape[1] > 8:
            if q.is_cuda:
                return _sdpa_prompt(query, key, value, causal, scaling), None
            out = _api.attention(q, k, v, algo="exact", causal=causal, softmax_scale=scaling)
        else:
            out = _api.attention(q, k, v, algo=algo, causal=causal, softmax_scale=scaling)
        return out, None

    forward.__name__ = f"ferrattn_{algo}_attention_forward"
    return forward


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
