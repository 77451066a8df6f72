"""ferrattn: TurboAttention, LeanAttention and TurboQuant attention for inference engines.

Tensors go in and out through DLPack (torch, numpy, cupy, jax), on the CPU (the emulations, in
float32) or on CUDA (zero-copy, on the caller's current stream). See ``attention``,
``BatchDecodeWithPagedKVCacheWrapper``, ``TurboCache`` and ``TurboQuantCache``. Every error is a subclass of
``ferrattn.Error`` and of the builtin you would catch (``ValueError``, ``TypeError``,
``RuntimeError``), with the offending values in its message.

The torch ops (``torch.ops.ferrattn.attention``) and the transformers attention functions
(``ferrattn_exact``, ``ferrattn_lean``, ``ferrattn_turbo``) register themselves when torch or
transformers is imported; numpy alone is enough for everything else.
"""

from ._ferrattn import (
    GIT_COMMIT,
    BackendError,
    DeviceError,
    DTypeError,
    Error,
    InvalidValueError,
    LayoutError,
    PageTableError,
    ShapeError,
    UnsupportedError,
    cpu_threads,
)
from ._api import ALGORITHMS, BatchDecodeWithPagedKVCacheWrapper, TurboCache, TurboQuantCache, attention
from . import context_parallel
from .context_parallel import merge_states
from . import _lazy


def _register_torch():
    from . import torch_ops

    torch_ops.register()


def _register_transformers():
    from . import hf

    hf.register()


_lazy.on_import("torch", _register_torch)
_lazy.on_import("transformers", _register_transformers)

__all__ = [
    "ALGORITHMS",
    "BackendError",
    "BatchDecodeWithPagedKVCacheWrapper",
    "DTypeError",
    "DeviceError",
    "Error",
    "GIT_COMMIT",
    "cpu_threads",
    "InvalidValueError",
    "LayoutError",
    "PageTableError",
    "ShapeError",
    "TurboCache",
    "TurboQuantCache",
    "UnsupportedError",
    "attention",
    "context_parallel",
    "merge_states",
]
