"""The Python API: ``attention``, the paged decode wrapper and the TurboAttention cache.

Layouts follow the libraries engines already call: ``attention`` takes flash-attn's
``[batch, seq, heads, head_dim]`` tensors and returns its ``softmax_lse`` shape
``[batch, heads, seq_q]``; the decode wrapper takes FlashInfer's ``[batch, heads, head_dim]``
queries and NHD pages ``[num_pages, page_size, heads_kv, head_dim]``.

LSE is the natural logarithm of the softmax normaliser of the scaled logits,
``lse = log(sum_j exp(softmax_scale * q . k_j))``, as flash-attn returns it (FlashInfer returns
base 2; multiply ours by ``1/ln 2`` to compare). Rows with no visible key get ``-inf`` and a zero
output.
"""

from __future__ import annotations

from . import _ferrattn as _native
from . import _tensors as _t
from . import torch_ops

ALGORITHMS = ("exact", "lean", "turbo", "turboquant")


def _prepare(tensors, outputs, stream):
    """Capsules for the inputs and the caller's outputs, and the stream handle (None on the host)."""
    first = tensors[0]
    if stream is None and _t.framework(first) == "torch":
        # the per-layer hot path: torch's C exporter, torch's own current stream (so no
        # producer/consumer handshake is needed), no Python-level protocol calls
        try:
            return _prepare_torch(first, tensors, outputs)
        except TypeError:
            pass  # a tensor of another framework among them: the general protocol below
    dev = _t.device_of(first)
    handle = _t.current_stream(first, stream) if dev[0] == _t.DL_CUDA else None
    own = stream is None
    caps = [_t.export(x, handle, own) for x in tensors]
    outs = [None if o is None else _t.export(o, handle, own) for o in outputs]
    return dev, handle, caps, outs


def _prepare_torch(first, tensors, outputs):
    td = _t._torch_to_dlpack
    if first.is_cuda:
        dev = (_t.DL_CUDA, first.get_device())
        handle = _t.current_stream(first)
    else:
        dev, handle = (_t.DL_CPU, 0), None
    caps = [td(x) for x in tensors]
    outs = [None if o is None else td(o) for o in outputs]
    return dev, handle, caps, outs


def _finish(like, given, produced):
    """The caller's tensor when it passed one, else the framework's view of ferrattn's result."""
    if given is not None:
        return given
    if produced is None:
        return None
    return _t.import_host(like, produced)


def _device_outputs(like, dev, out, lse, o_shape, lse_shape, want_lse):
    """CUDA outputs are allocated by the caller's framework (torch's caching allocator, cupy's
    pool) unless the caller passed its own."""
    if dev[0] != _t.DL_CUDA:
        return out, lse
    if out is None:
        out = _t.empty_device(like, o_shape)
    if lse is None and want_lse:
        lse = _t.empty_device(like, lse_shape, "float32")
    return out, lse


def attention(
    q,
    k,
    v,
    algo="exact",
    causal=False,
    softmax_scale=None,
    return_lse=False,
    *,
    out=None,
    lse=None,
    stream=None,
):
    """Attention of ``q [B, Sq, Hq, D]`` over ``k [B, Sk, Hk, D]``, ``v [B, Sk, Hk, Dv]``.

    ``algo``: ``"exact"`` (blocked online softmax), ``"lean"`` (LeanAttention stream-K decode,
    ``Sq <= 8``), ``"turbo"`` (TurboAttention: INT8 FlashQ + SAS; ``Sq >= Sk`` is a prefill,
    ``Sq < Sk`` compresses the first ``Sk - Sq`` keys and decodes), ``"turboquant"``
    (attention over a TurboQuant-compressed cache). ``causal`` aligns the mask to the bottom
    right (query ``i`` sees keys ``0 .. i + Sk - Sq``), as flash-attn does. ``softmax_scale``
    defaults to ``1/sqrt(D)``.

    Tensors may come from any DLPack producer (torch, numpy, cupy, jax), all on one device. Host
    tensors run the CPU emulation, which reads them through their DLPack pointers and computes in
    float32 (f16/bf16 inputs are widened exactly, outputs rounded back to q's dtype). CUDA tensors
    run on the caller's current stream (or ``stream``) without a copy.

    Returns ``out [B, Sq, Hq, Dv]`` in q's dtype, or ``(out, lse)`` with ``lse`` float32
    ``[B, Hq, Sq]`` (natural log) when ``return_lse``. ``out=``/``lse=`` write into the caller's
    tensors (exact shape, or a flat contiguous buffer with enough elements) instead.
    """
    # while torch.compile traces, go through the registered op (one opaque node) instead of
    # tracing into the DLPack exchange
    if torch_ops.is_compiling is not None and torch_ops.is_compiling():
        o, l = torch_ops.attention(q, k, v, algo, causal, softmax_scale, out, lse)
        return (o, l) if return_lse else o
    return _attention_direct(q, k, v, algo, causal, softmax_scale, return_lse, out, lse, stream)


def _attention_direct(q, k, v, algo, causal, softmax_scale, return_lse, out, lse, stream):
    dev = _t.device_of(q)
    if dev[0] == _t.DL_CUDA:
        return _attention_cuda(q, k, v, algo, causal, softmax_scale, return_lse, out, lse, stream)
    dev, handle, (qc, kc, vc), (oc, lc) = _prepare((q, k, v), (out, lse), stream)
    o, l = _native.attention(
        qc, kc, vc, algo, bool(causal), softmax_scale, oc, lc, bool(return_lse), handle
    )
    o = _finish(q, out, o)
    if not return_lse:
        return o
    return o, _finish(q, lse, l)


def _attention_cuda(q, k, v, algo, causal, softmax_scale, return_lse, out, lse, stream):
    """CUDA tensors: Lean decode through the device path, on the caller's stream; outputs and the
    step's workspace come from the caller's framework."""
    if algo != "lean":
        # the native call checks devices and shapes first, then refuses the algorithm
        dev, handle, (qc, kc, vc), (oc, lc) = _prepare((q, k, v), (out, lse), stream)
        _native.attention(qc, kc, vc, algo, bool(causal), softmax_scale, oc, lc, True, handle)
    if out is None or lse is None:
        b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
        # the kernel always writes the LSE, so it needs a buffer even when the caller wants none
        out, lse = _device_outputs(q, _t.device_of(q), out, lse, (b, sq, hq, v.shape[-1]), (b, hq, sq), True)
    dev, handle, (qc, kc, vc), (oc, lc) = _prepare((q, k, v), (out, lse), stream)
    step = _native.DeviceDecode(qc, kc, vc, bool(causal), softmax_scale)
    ws = _t.empty_device(q, (max(step.workspace_bytes, 1),), "uint8")
    step.begin(_t.export(ws, handle), handle)
    step.run(qc, kc, vc, oc, lc, handle)
    return (out, lse) if return_lse else out


def _dtype_name(dt):
    """'f16' / 'bf16' / 'f32' from a torch, numpy or string dtype."""
    s = str(dt).replace("torch.", "").lower()
    return {"float16": "f16", "half": "f16", "f16": "f16", "bfloat16": "bf16", "bf16": "bf16",
            "float32": "f32", "float": "f32", "f32": "f32"}.get(s, s)


def _as_int32_host(x, name):
    """A host int32 array from a list, numpy, torch, cupy or jax integer array (read on the host
    at plan time: the plan is made on the host once per step, as FlashInfer's is). Other integer
    widths are range-checked and narrowed (engines keep tables in int64 as often as in int32);
    non-integer arrays are passed on for the native check to name their dtype."""
    import numpy as np

    fw = _t.framework(x)
    if fw == "torch":
        x = x.detach().cpu().numpy()
    elif fw == "cupy":
        x = x.get()
    a = np.asarray(x)
    if a.dtype.kind in "iu" and a.dtype != np.int32:
        if a.size and (a.max() >= 2**31 or a.min() < -(2**31)):
            raise _native.PageTableError(f"{name} holds values outside int32 ({a.min()} .. {a.max()})")
        a = a.astype(np.int32)
    return a


class BatchDecodeWithPagedKVCacheWrapper:
    """Decode over a paged KV cache, planned once per step and run once per layer (FlashInfer's
    ``BatchDecodeWithPagedKVCacheWrapper`` is the model).

    The cache is NHD: ``k_cache``, ``v_cache`` ``[num_pages, page_size, heads_kv, head_dim]``
    (or one tensor ``[num_pages, 2, page_size, heads_kv, head_dim]``), and a page table
    ``[batch, max_pages]`` of int32 page indices as vLLM and FlashAttention's ``block_table``
    lay it out: token ``t`` of sequence ``b`` is row ``t % page_size`` of page
    ``page_table[b, t // page_size]``.

    ``plan`` checks the table (every page a sequence uses is in ``0 .. num_pages``, every
    sequence fits in its pages) once; ``run`` checks the layer's tensors against the plan and
    launches. ``run`` returns ``(out [B, Hq, D], lse float32 [B, Hq])``, LSE in natural log.
    """

    def __init__(self, workspace_buffer=None, kv_layout="NHD", algo="lean"):
        """``workspace_buffer``: a CUDA ``uint8`` tensor the steps' tables and partials live in
        (its device is where the steps run); without one, host tensors run on the CPU and a
        ``device=`` given to ``plan`` gets a workspace from torch, grown as steps need."""
        if kv_layout != "NHD":
            raise _native.UnsupportedError(
                f"kv_layout={kv_layout!r}; the paged cache is NHD [num_pages, page_size, heads_kv, head_dim]"
            )
        self._workspace = workspace_buffer
        self._algo = algo
        self._plan = None

    def plan(
        self,
        page_table,
        seq_lens,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        *,
        sm_scale=None,
        num_pages=None,
        q_data_type=None,
        device=None,
        stream=None,
    ):
        """Plans one decode step. ``page_table`` ``[batch, max_pages]`` and ``seq_lens``
        ``[batch]`` are int32 (lists, numpy or torch; read on the host). ``num_pages``, when
        given, bounds the page indices now; ``run`` bounds them by the pool it is given anyway.

        On CUDA (a CUDA ``workspace_buffer``, or ``device="cuda:N"``) ``num_pages`` and
        ``q_data_type`` (float16 or bfloat16) are required: the page table is checked against
        the pool and the step's tables are copied into the workspace here, on the current
        stream, so that ``run`` only launches (and can be captured in a CUDA graph)."""
        pt = _as_int32_host(page_table, "page_table")
        sl = _as_int32_host(seq_lens, "seq_lens")
        ordinal = self._cuda_ordinal(device)
        self._plan = _native.PagedDecodePlan(
            _t.export(pt),
            _t.export(sl),
            int(page_size),
            int(num_qo_heads),
            int(num_kv_heads),
            int(head_dim),
            None if sm_scale is None else float(sm_scale),
            self._algo,
            None if num_pages is None else int(num_pages),
            ordinal,
            None if q_data_type is None else _dtype_name(q_data_type),
        )
        self._shape = (len(sl), int(num_qo_heads), int(head_dim))
        if ordinal is not None:
            need = self._plan.workspace_bytes
            ws = self._workspace
            if ws is None or ws.numel() * ws.element_size() < need:
                import torch

                ws = torch.empty(max(need, 1), dtype=torch.uint8, device=f"cuda:{ordinal}")
                self._workspace = ws
            handle = _t.current_stream(ws, stream)
            self._plan.begin(_t.export(ws, handle), handle)

    def _cuda_ordinal(self, device):
        """The CUDA device the steps run on, or None for the host."""
        ws = self._workspace
        if ws is not None:
            dt, di = _t.device_of(ws)
            return di if dt == _t.DL_CUDA else None
        if device is None:
            return None
        s = str(device)
        if s == "cpu":
            return None
        if isinstance(device, int):
            return device
        if s.startswith("cuda"):
            return int(s.split(":")[1]) if ":" in s else 0
        raise _native.DeviceError(f"device={device!r}; expected 'cpu', 'cuda' or 'cuda:N'")

    def run(self, q, paged_kv_cache, *, out=None, lse=None, stream=None):
        """One layer: ``q [B, Hq, D]`` over ``paged_kv_cache`` (``(k_cache, v_cache)`` or one
        ``[num_pages, 2, page_size, Hk, D]`` tensor). Returns ``(out, lse)``."""
        if self._plan is None:
            raise _native.UnsupportedError("run() before plan(): plan the step first")
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise _native.ShapeError(
                    f"paged_kv_cache is a sequence of {len(paged_kv_cache)} tensors; expected (k_cache, v_cache)"
                )
            kc, vc = paged_kv_cache
        else:
            shape = tuple(paged_kv_cache.shape)
            if len(shape) != 5 or shape[1] != 2:
                raise _native.ShapeError(
                    f"paged_kv_cache has shape {list(shape)}; a single tensor must be [num_pages, 2, page_size, heads_kv, head_dim]"
                )
            kc, vc = paged_kv_cache[:, 0], paged_kv_cache[:, 1]
        if out is None or lse is None:
            b, hq, d = self._shape
            out, lse = _device_outputs(q, _t.device_of(q), out, lse, (b, hq, d), (b, hq), True)
        _, handle, (qc, kcc, vcc), (oc, lc) = _prepare((q, kc, vc), (out, lse), stream)
        o, l = self._plan.run(qc, kcc, vcc, oc, lc, handle)
        if o is None and l is None:
            return out, lse
        return _finish(q, out, o), _finish(q, lse, l)


class TurboCache:
    """The TurboAttention KV cache of a batch: INT4/INT2 channelwise blocks plus an INT8 buffer
    for new tokens with one universal scale (TurboAttention section 3.3).

    ``prefill(q, k, v)`` runs the prefill (Alg. 1) and compresses ``k``, ``v`` into the cache;
    ``append(k, v)`` adds one token per sequence (``[B, 1, Hk, D]``; a full buffer of 64 tokens
    becomes a block); ``decode(q)`` attends ``q [B, 1, Hq, D]`` over everything held (Alg. 2) and
    returns ``(out [B, 1, Hq, D], lse float32 [B, Hq, 1])``. ``kv_bits`` is ``"int4"``,
    ``"int2"``, ``"mixed"`` (the lower-priority half of the KV heads at 2 bits, section 3.2) or a
    list of 2 and 4, one per KV head.

    The cache lives where the last ``prefill``'s tensors are. On CUDA tensors (float16/bfloat16,
    head dim 64 or 128) it is a device object of ferrattn's device path: its memory is allocated
    once, at the first CUDA prefill, for ``max_tokens`` tokens per sequence (default: the prompt
    plus 4096); every call runs on the caller's current stream (or ``stream=``) with outputs and
    a workspace from the caller's framework, and nothing is synchronised or copied to the host.
    Each CUDA call plans its own step and copies that step's small tables into the workspace,
    so it is not a call to capture in a CUDA graph (the Rust device path's ``TurboDecodeStep``
    is). ``"mixed"`` needs host statistics of the prompt and is refused on CUDA: pass the bits
    per KV head (e.g. a host prefill's ``bits``) or ``"int4"`` / ``"int2"``.

    On a Hopper GPU (sm_90) a CUDA cache decodes on the fast-contract kernels by default (MUFU
    exponentials, P quantized against the tile's known maximum: O within 2e-2 relative and LSE
    within 1e-2 of the bit-exact kernels, no less accurate against exact attention;
    docs/TURBO_CUDA.md); ``exact_decode=True`` selects the bit-exact kernels, whose output
    equals the CPU emulation's (the host cache) step for step. Other GPUs decode bit-exact.
    """

    def __init__(self, batch, heads_kv, head_dim, kv_bits="mixed", sas=True, max_tokens=None, exact_decode=False):
        bits = kv_bits if isinstance(kv_bits, str) else [int(b) for b in kv_bits]
        mt = None if max_tokens is None else int(max_tokens)
        self._c = _native.TurboCache(int(batch), int(heads_kv), int(head_dim), bits, bool(sas), mt, bool(exact_decode))
        self.batch, self.heads_kv, self.head_dim = int(batch), int(heads_kv), int(head_dim)
        self._ws = None

    def _workspace(self, like, nbytes):
        """The cache's CUDA workspace, from ``like``'s framework, grown when a call needs more.
        Kept on the cache so it outlives the work enqueued with it."""
        ws = self._ws
        if ws is None or ws.shape[0] < nbytes or _t.device_of(ws) != _t.device_of(like):
            ws = _t.empty_device(like, (max(int(nbytes), 1),), "uint8")
            self._ws = ws
        return ws

    def prefill(self, q, k, v, causal=True, softmax_scale=None, *, out=None, lse=None, stream=None):
        dev = _t.device_of(q)
        if dev[0] == _t.DL_CUDA:
            b, sq, hq = q.shape[0], q.shape[1], q.shape[2]
            out, lse = _device_outputs(q, dev, out, lse, (b, sq, hq, v.shape[-1]), (b, hq, sq), True)
            ws = self._workspace(q, self._c.workspace_bytes("prefill", int(sq), int(hq)))
            dev, handle, (qc, kc, vc), (oc, lc) = _prepare((q, k, v), (out, lse), stream)
            self._c.prefill(qc, kc, vc, bool(causal), softmax_scale, oc, lc, handle, _t.export(ws, handle))
            return out, lse
        dev, handle, (qc, kc, vc), (oc, lc) = _prepare((q, k, v), (out, lse), stream)
        o, l = self._c.prefill(qc, kc, vc, bool(causal), softmax_scale, oc, lc, handle)
        return _finish(q, out, o), _finish(q, lse, l)

    def append(self, k, v, *, stream=None):
        dev, handle, (kc, vc), _ = _prepare((k, v), (), stream)
        ws = None
        if dev[0] == _t.DL_CUDA:
            need = self._c.workspace_bytes("append", 0, 0, _t.export(k, handle))
            ws = _t.export(self._workspace(k, need), handle)
        self._c.append(kc, vc, handle, ws)

    def decode(self, q, softmax_scale=None, *, out=None, lse=None, stream=None):
        dev = _t.device_of(q)
        if dev[0] == _t.DL_CUDA:
            b, hq = q.shape[0], q.shape[2]
            out, lse = _device_outputs(q, dev, out, lse, (b, 1, hq, self.head_dim), (b, hq, 1), True)
            dev, handle, (qc,), (oc, lc) = _prepare((q,), (out, lse), stream)
            need = self._c.workspace_bytes("decode", 0, int(hq), _t.export(q, handle))
            ws = _t.export(self._workspace(q, need), handle)
            self._c.decode(qc, softmax_scale, oc, lc, handle, ws)
            return out, lse
        dev, handle, (qc,), (oc, lc) = _prepare((q,), (out, lse), stream)
        o, l = self._c.decode(qc, softmax_scale, oc, lc, handle)
        return _finish(q, out, o), _finish(q, lse, l)

    def seq_len(self, b):
        """Tokens held for sequence ``b``."""
        return self._c.seq_len(int(b))

    @property
    def bits(self):
        """Bits of each KV head's compressed blocks (chosen at prefill by head priority)."""
        return self._c.bits

    def memory(self):
        """Bytes held (compressed blocks, INT8 buffers), the fp16 equivalent and the ratio."""
        return self._c.memory()

    def allocated_bytes(self):
        """Device bytes allocated for a CUDA cache (its capacity); 0 for a host cache."""
        return self._c.allocated_bytes()


class TurboQuantCache:
    """The TurboQuant compressed KV cache of a batch (Zandieh et al.): every token's key and
    value rotated and quantized coordinate by coordinate on a Lloyd-Max codebook, keys with the
    QJL sign sketch of their residual (``key_qjl``; unbiased inner products), norms in float16.

    ``append(k, v)`` compresses ``k``, ``v`` ``[B, S, Hk, D]`` (``S >= 1`` tokens added to every
    sequence: a prompt, or one token per decode step); ``decode(q)`` attends ``q [B, 1, Hq, D]``
    over everything held and returns ``(out [B, 1, Hq, D], lse float32 [B, Hq, 1])``, LSE in the
    natural log as flash-attn returns it. ``key_bits`` counts the QJL bit when ``key_qjl``;
    ``seed`` picks the rotation and the sketch (a cache is always decoded with its own).

    The cache lives where its first ``append``'s tensors are. On CUDA tensors (float16, head dim
    64 or 128, 2-4 bits) it is a device object of ferrattn's device path
    (``ferrattn::device_api::TurboQuantCache``): its memory is allocated at the first append for
    ``max_tokens`` tokens per sequence (default 4096, rounded up to 16), every call runs on the
    caller's current stream (or ``stream=``) with outputs and workspaces from the caller's
    framework (one for appends, one for decodes, kept on the cache and grown when a step needs
    more), and nothing is synchronised or copied to the host. Each CUDA call plans its step and
    copies the step's small tables into the workspace on the stream; a ``decode`` with the same
    query heads and scale over the same lengths as the previous one finds its tables there and
    only launches, so after one eager ``decode`` the same decode (of every layer's cache) can be
    captured in a CUDA graph and replayed; ``append`` moves the lengths and stays outside the
    graph. On host tensors (float32/float16/bfloat16) ``decode`` runs the CPU emulation, which
    defines what the kernels compute.

    ``compress`` picks the kernels that compress a CUDA cache's appends (the decode reads them all
    the same way; ``ferrattn::device_api::TurboQuantCompression`` states each contract):

    - ``"exact"``: codes, QJL signs and norms equal the CPU emulation's bit for bit, on CUDA
      cores; a prompt compresses 8-95x slower than ``"fast"``, a decode step's append costs about
      145 us at batch 16 (H200).
    - ``"fast"`` (the default on CUDA, what a server wants): tensor cores with the rotation in
      float16; norms bit-exact, a code differs from the emulation's only at a near tie (the
      rotated coordinate within 2^-11 + 2^-14 of a codebook boundary; about 1e-4 to 5e-4 of
      them), residual norms within 2^-10 and QJL signs within a 2^-9 margin; attention over such a
      cache is as accurate as over the exact one (error ratio 1.003 in the geometric mean); a
      step's append about 16 us at batch 16.
    - ``"split"``: as ``"fast"`` with the rotation in two float16 halves (about float32): codes
      differ only within 2^-14 of a boundary; 5-53% slower than ``"fast"``.

    A host cache is the emulation, the exact contract: it takes ``compress="exact"`` or nothing,
    and ``"fast"`` / ``"split"`` with host tensors raise ``UnsupportedError``. Any other name
    raises ``UnsupportedError`` here. ``compress`` (the attribute) says which path a cache uses.
    """

    def __init__(self, batch, heads_kv, head_dim, key_bits=4, value_bits=3, key_qjl=True, seed=None, max_tokens=None, compress=None):
        mt = None if max_tokens is None else int(max_tokens)
        sd = None if seed is None else int(seed)
        cp = None if compress is None else str(compress)
        self._c = _native.TurboQuantCache(
            int(batch), int(heads_kv), int(head_dim), int(key_bits), int(value_bits), bool(key_qjl), sd, mt, cp
        )
        self.batch, self.heads_kv, self.head_dim = int(batch), int(heads_kv), int(head_dim)
        self._ws = {}

    def _workspace(self, kind, like, nbytes):
        """The cache's CUDA workspace for ``kind`` ("append" or "decode"), from ``like``'s
        framework, grown when a step needs more. Kept on the cache so it outlives the work
        enqueued with it (and, for decodes, so the next decode of the same step finds its
        tables there)."""
        ws = self._ws.get(kind)
        if ws is None or ws.shape[0] < nbytes or _t.device_of(ws) != _t.device_of(like):
            ws = _t.empty_device(like, (max(int(nbytes), 1),), "uint8")
            self._ws[kind] = ws
        return ws

    def append(self, k, v, *, stream=None):
        """Compresses ``k``, ``v`` ``[B, S, Hk, D]`` into the cache (S tokens per sequence)."""
        dev, handle, (kc, vc), _ = _prepare((k, v), (), stream)
        ws = None
        if dev[0] == _t.DL_CUDA:
            need = self._c.workspace_bytes("append", int(k.shape[1]), 0, None, _t.export(k, handle))
            ws = _t.export(self._workspace("append", k, need), handle)
        self._c.append(kc, vc, handle, ws)

    def decode(self, q, softmax_scale=None, *, out=None, lse=None, stream=None):
        """Attention of ``q [B, 1, Hq, D]`` over every token held: ``(out, lse)``. On CUDA,
        ``out`` and ``lse`` are allocated by ``q``'s framework unless given."""
        dev = _t.device_of(q)
        if dev[0] == _t.DL_CUDA:
            b, hq = q.shape[0], q.shape[2]
            out, lse = _device_outputs(q, dev, out, lse, (b, 1, hq, self.head_dim), (b, hq, 1), True)
            dev, handle, (qc,), (oc, lc) = _prepare((q,), (out, lse), stream)
            need = self._c.workspace_bytes("decode", 0, int(hq), softmax_scale, _t.export(q, handle))
            ws = _t.export(self._workspace("decode", q, need), handle)
            self._c.decode(qc, softmax_scale, oc, lc, handle, ws)
            return out, lse
        dev, handle, (qc,), (oc, lc) = _prepare((q,), (out, lse), stream)
        o, l = self._c.decode(qc, softmax_scale, oc, lc, handle)
        return _finish(q, out, o), _finish(q, lse, l)

    @property
    def lens(self):
        """Tokens held per sequence."""
        return self._c.lens

    @property
    def compress(self):
        """The compression path of the appends ("exact", "fast" or "split"): the one asked for;
        unset, "exact" for a host cache and "fast" for a CUDA one (None before the first append)."""
        return self._c.compress

    def seq_len(self, b):
        """Tokens held for sequence ``b``."""
        return self._c.seq_len(int(b))

    def reset(self):
        """Forgets every token (a CUDA cache keeps its memory)."""
        self._c.reset()

    def config(self):
        """The configuration: key/value bits, QJL, its sketch size and the seed."""
        return self._c.config()

    def memory(self):
        """Bytes of the compressed tokens (device layout), the fp16 bytes they stand for, the ratio."""
        return self._c.memory()

    def allocated_bytes(self):
        """Device bytes allocated for a CUDA cache (its capacity); 0 for a host cache."""
        return self._c.allocated_bytes()
