"""DLPack plumbing shared by the API: which framework a tensor belongs to, which CUDA stream to
order the call on, the capsule to hand to the native module, and outputs allocated through the
caller's framework.

The DLPack protocol (Python array API standard) is used as written: the consumer asks the
producer for a capsule with ``__dlpack__(stream=s)``, where ``s`` is the stream the consumer will
use, so the producer can order its pending work before it. ferrattn launches on that same stream.
"""

from __future__ import annotations

import sys

DL_CPU = 1
DL_CUDA = 2


_FRAMEWORK = {}
# torch's C entry points for the per-layer hot path (set at first use): DLPack export without the
# Python-level stream handshake of Tensor.__dlpack__, and the raw current stream
_torch_to_dlpack = None
_torch_raw_stream = None


def framework(x):
    """'torch', 'numpy', 'cupy', 'jax' or 'other', from the tensor's type (no import)."""
    t = type(x)
    fw = _FRAMEWORK.get(t)
    if fw is None:
        mod = t.__module__.split(".", 1)[0]
        fw = mod if mod in ("torch", "numpy", "cupy") else "jax" if mod in ("jax", "jaxlib") else "other"
        _FRAMEWORK[t] = fw
        if fw == "torch":
            _bind_torch()
    return fw


def _bind_torch():
    global _torch_to_dlpack, _torch_raw_stream
    import torch

    _torch_to_dlpack = torch.utils.dlpack.to_dlpack
    _torch_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def device_of(x):
    """``(device_type, device_id)`` as DLPack numbers them."""
    if framework(x) == "torch":
        return (DL_CUDA, x.get_device()) if x.is_cuda else (DL_CPU, 0)
    try:
        return tuple(x.__dlpack_device__())
    except AttributeError:
        raise TypeError(
            f"{type(x).__name__} does not speak DLPack (no __dlpack_device__); pass a torch, "
            "numpy, cupy or jax array"
        ) from None


def current_stream(x, stream=None):
    """The raw ``cudaStream_t`` (an int) to run on for a CUDA tensor ``x``.

    ``stream`` may be an int handle, a ``torch.cuda.Stream`` or a ``cupy.cuda.Stream``; by
    default the framework's current stream (torch's ``current_stream``, cupy's
    ``get_current_stream``), else the legacy default stream.
    """
    if stream is not None:
        if isinstance(stream, int):
            return stream
        for attr in ("cuda_stream", "ptr"):
            if hasattr(stream, attr):
                return int(getattr(stream, attr))
        raise TypeError(f"stream must be an int handle or a CUDA stream object, got {stream!r}")
    fw = framework(x)
    if fw == "torch":
        if _torch_raw_stream is not None:
            return _torch_raw_stream(x.get_device())
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if fw == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def export(x, stream=None, producer_stream=True):
    """The DLPack capsule of ``x``. ``stream`` is the consumer's CUDA stream handle (``None``
    for host tensors). DLPack >= 1.0 capsules are asked for first (they carry a read-only flag).

    ``producer_stream``: ``stream`` is the producer's own current stream (the default, when the
    caller named none), so no handshake is needed and torch tensors take its C exporter."""
    if framework(x) == "torch":
        if x.requires_grad:
            x = x.detach()
        if producer_stream or not x.is_cuda:
            return _torch_to_dlpack(x)
    if stream is not None:
        # DLPack reserves 0 ("ambiguous"); 1 names the legacy default stream that handle 0 is
        stream = stream or 1
    try:
        return x.__dlpack__(stream=stream, max_version=(1, 0))
    except TypeError:
        # producers written before the 2023 revision of the protocol
        return x.__dlpack__(stream=stream) if stream is not None else x.__dlpack__()


def import_host(like, t):
    """A host tensor made by ferrattn (``t``), imported without a copy by ``like``'s framework."""
    fw = framework(like)
    if fw == "torch":
        import torch

        return torch.from_dlpack(t)
    if fw == "jax":
        import jax.numpy as jnp

        return jnp.from_dlpack(t)
    import numpy as np

    return np.from_dlpack(t)


def empty_device(like, shape, dtype=None):
    """An uninitialised CUDA tensor allocated by ``like``'s framework (its caching allocator),
    with ``like``'s dtype, or ``dtype`` ('float32', 'uint8')."""
    fw = framework(like)
    if fw == "torch":
        import torch

        dt = {"float32": torch.float32, "uint8": torch.uint8}.get(dtype, like.dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    if fw == "cupy":
        import cupy

        dt = {"float32": cupy.float32, "uint8": cupy.uint8}.get(dtype, like.dtype)
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=dt)
    from ._ferrattn import UnsupportedError

    raise UnsupportedError(
        f"ferrattn cannot allocate a CUDA output for a {type(like).__name__} (its framework has "
        "no writable device arrays it knows of); pass out= and lse= tensors"
    )


def loaded(name):
    return name in sys.modules
