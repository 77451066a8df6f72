"""Every bad tensor gives a typed exception carrying the offending values, raised before anything
reads through the tensor (and never a crash). The "cuda" tensors here are host buffers whose
DLPack export claims device memory (``ferrattn._ferrattn.probe_tensor``): the boundary must
reject them on their description alone."""

from __future__ import annotations

import numpy as np
import pytest

import ferrattn
from ferrattn._ferrattn import probe_tensor

DL_FLOAT, DL_INT, DL_BFLOAT = 2, 0, 4
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_ROCM = 1, 2, 3, 10


def qkv(dtype=np.float32, d=64):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((1, 1, 4, d)).astype(dtype),
        rng.standard_normal((1, 16, 2, d)).astype(dtype),
        rng.standard_normal((1, 16, 2, d)).astype(dtype),
    )


def test_classes_subclass_the_builtins():
    assert issubclass(ferrattn.ShapeError, ValueError) and issubclass(ferrattn.ShapeError, ferrattn.Error)
    assert issubclass(ferrattn.DTypeError, TypeError)
    assert issubclass(ferrattn.BackendError, RuntimeError)
    for c in (ferrattn.LayoutError, ferrattn.DeviceError, ferrattn.PageTableError, ferrattn.UnsupportedError):
        assert issubclass(c, ValueError) and issubclass(c, ferrattn.Error)


# --- short buffer


def test_short_flat_output_buffer():
    q, k, v = qkv()
    with pytest.raises(ferrattn.LayoutError, match=r"flat buffer of 255 elements but the output \[1, 1, 4, 64\] needs 256"):
        ferrattn.attention(q, k, v, out=np.empty(255, np.float32))


def test_output_of_the_wrong_shape():
    q, k, v = qkv()
    with pytest.raises(ferrattn.ShapeError, match=r"out has shape \[1, 1, 4, 32\] but the output is \[1, 1, 4, 64\]"):
        ferrattn.attention(q, k, v, out=np.empty((1, 1, 4, 32), np.float32))
    with pytest.raises(ferrattn.ShapeError, match=r"lse has shape \[1, 1, 4\] but the output is \[1, 4, 1\]"):
        ferrattn.attention(q, k, v, return_lse=True, lse=np.empty((1, 1, 4), np.float32))


# --- wrong stride


def test_head_dim_must_be_contiguous():
    q, k, v = qkv()
    wide = np.zeros((1, 16, 2, 128), np.float32)
    with pytest.raises(ferrattn.LayoutError, match=r"k has strides \[4096, 256, 128, 2\] .* the last axis must have stride 1"):
        ferrattn.attention(q, wide[..., ::2], v)


def test_negative_strides():
    q, k, v = qkv()
    with pytest.raises(ferrattn.LayoutError, match=r"v has stride -128 on axis 1"):
        ferrattn.attention(q, k, v[:, ::-1])


def test_overlapping_output():
    q, k, v = qkv()
    out = probe_tensor([1, 1, 4, 64], DL_FLOAT, 32, strides=[256, 256, 0, 1])
    with pytest.raises(ferrattn.LayoutError, match=r"out has strides \[256, 256, 0, 1\] .* overlap"):
        ferrattn.attention(q, k, v, out=out)


def test_read_only_output():
    q, k, v = qkv()
    out = np.empty((1, 1, 4, 64), np.float32)
    out.flags.writeable = False
    with pytest.raises((ferrattn.LayoutError, BufferError), match="read-only|readonly"):
        ferrattn.attention(q, k, v, out=out)
    flagged = probe_tensor([1, 1, 4, 64], DL_FLOAT, 32, read_only=True)
    with pytest.raises(ferrattn.LayoutError, match="out is read-only"):
        ferrattn.attention(q, k, v, out=flagged)


# --- wrong device


def test_mixed_devices():
    q, k, v = qkv()
    kc = probe_tensor([1, 16, 2, 64], DL_FLOAT, 32, device_type=DL_CUDA)
    with pytest.raises(ferrattn.DeviceError, match="k is on cuda:0 but q is on cpu"):
        ferrattn.attention(q, kc, v)
    q1 = probe_tensor([1, 1, 4, 64], DL_FLOAT, 32, device_type=DL_CUDA, device_id=1)
    k0 = probe_tensor([1, 16, 2, 64], DL_FLOAT, 32, device_type=DL_CUDA, device_id=0)
    v0 = probe_tensor([1, 16, 2, 64], DL_FLOAT, 32, device_type=DL_CUDA, device_id=0)
    with pytest.raises(ferrattn.DeviceError, match="k is on cuda:0 but q is on cuda:1"):
        ferrattn.attention(q1, k0, v0)


@pytest.mark.parametrize("dev,what", [(DL_CUDA_HOST, "pinned host memory"), (DL_ROCM, "DLPack device type 10")])
def test_unsupported_device_types(dev, what):
    q, k, v = qkv()
    bad = probe_tensor([1, 1, 4, 64], DL_FLOAT, 32, device_type=dev)
    with pytest.raises(ferrattn.DeviceError, match=what):
        ferrattn.attention(bad, k, v)


def test_output_on_another_device():
    q, k, v = qkv()
    out = probe_tensor([1, 1, 4, 64], DL_FLOAT, 32, device_type=DL_CUDA)
    with pytest.raises(ferrattn.DeviceError, match="out is on cuda:0 but q is on cpu"):
        ferrattn.attention(q, k, v, out=out)


# --- misaligned


def test_misaligned_pointer():
    q, k, v = qkv(np.float16)
    raw = np.zeros(2 * k.size + 1, np.uint8)
    km = np.frombuffer(raw.data, dtype=np.float16, count=k.size, offset=1).reshape(k.shape)
    with pytest.raises(ferrattn.LayoutError, match=r"k starts at address 0x[0-9a-f]+, which is not a multiple of 2 bytes"):
        ferrattn.attention(q, km, v)
    off = probe_tensor([1, 16, 2, 64], DL_FLOAT, 32, byte_offset=2)
    with pytest.raises(ferrattn.LayoutError, match="not a multiple of 4 bytes"):
        ferrattn.attention(qkv()[0], off, qkv()[2])


# --- wrong dtype


@pytest.mark.parametrize("dtype,name", [(np.float64, "float64"), (np.int8, "int8"), (np.complex64, "complex64")])
def test_unsupported_dtypes(dtype, name):
    q, k, v = qkv()
    with pytest.raises(ferrattn.DTypeError, match=f"q has dtype {name}; expected float16, bfloat16 or float32"):
        ferrattn.attention(q.astype(dtype), k, v)


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(ferrattn.DTypeError, match="v is f16 but q is f32"):
        ferrattn.attention(q, k, v.astype(np.float16))


def test_output_dtype():
    q, k, v = qkv()
    with pytest.raises(ferrattn.DTypeError, match="out has dtype f16; expected f32"):
        ferrattn.attention(q, k, v, out=np.empty((1, 1, 4, 64), np.float16))
    with pytest.raises(ferrattn.DTypeError, match="lse has dtype f16; expected f32"):
        ferrattn.attention(q, k, v, return_lse=True, lse=np.empty((1, 4, 1), np.float16))


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="does not speak DLPack"):
        ferrattn.attention([[1.0]], k, v)


# --- shapes and values


def test_shape_disagreements():
    q, k, v = qkv()
    with pytest.raises(ferrattn.ShapeError, match=r"k has shape \[1, 16, 2, 32\]"):
        ferrattn.attention(q, k[..., :32].copy(), v)
    with pytest.raises(ferrattn.ShapeError, match=r"k has 3 heads but q has 4"):
        ferrattn.attention(q, np.zeros((1, 16, 3, 64), np.float32), np.zeros((1, 16, 3, 64), np.float32))
    with pytest.raises(ferrattn.ShapeError, match=r"q has shape \[4, 64\] \(rank 2\)"):
        ferrattn.attention(q[0, 0], k, v)


def test_non_finite_input():
    q, k, v = qkv()
    k[0, 3, 1, 5] = np.nan
    with pytest.raises(ferrattn.InvalidValueError, match="k holds a non-finite value"):
        ferrattn.attention(q, k, v)


def test_unsupported_configurations():
    q, k, v = qkv(d=48)
    with pytest.raises(ferrattn.UnsupportedError, match="head"):
        ferrattn.attention(q, k, v, algo="lean")
    with pytest.raises(ferrattn.UnsupportedError, match='algo="flash"'):
        ferrattn.attention(*qkv(), algo="flash")


# --- page tables


def paged_setup(page_size=16, num_pages=8):
    rng = np.random.default_rng(1)
    kc = rng.standard_normal((num_pages, page_size, 2, 64)).astype(np.float32)
    return rng.standard_normal((2, 4, 64)).astype(np.float32), kc, kc.copy()


def test_page_index_out_of_the_pool():
    q, kc, vc = paged_setup(num_pages=8)
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper()
    w.plan([[0, 1], [2, 9]], [20, 30], 4, 2, 64, 16)
    with pytest.raises(ferrattn.PageTableError, match=r"page_table\[1\]\[1\] is 9 but the pool \(k_cache\) holds 8 pages"):
        w.run(q, (kc, vc))
    with pytest.raises(ferrattn.PageTableError, match=r"page_table\[1\]\[1\] is 9; page indices must be in 0..8"):
        w.plan([[0, 1], [2, 9]], [20, 30], 4, 2, 64, 16, num_pages=8)
    with pytest.raises(ferrattn.PageTableError, match=r"page_table\[0\]\[0\] is -1"):
        w.plan([[-1, 1], [2, 3]], [20, 30], 4, 2, 64, 16)


def test_sequence_longer_than_its_pages():
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper()
    with pytest.raises(ferrattn.PageTableError, match=r"sequence 1 has 33 tokens but page_table gives it 2 pages of 16 \(32 tokens\)"):
        w.plan([[0, 1], [2, 3]], [20, 33], 4, 2, 64, 16)


def test_unused_page_slots_are_not_read():
    # slots past a sequence's pages may hold anything (engines leave them stale)
    q, kc, vc = paged_setup()
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper()
    w.plan([[0, 123456], [2, -7]], [16, 5], 4, 2, 64, 16)
    out, lse = w.run(q, (kc, vc))
    assert np.isfinite(out).all() and np.isfinite(lse).all()


def test_paged_tensors_against_the_plan():
    q, kc, vc = paged_setup()
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper()
    with pytest.raises(ferrattn.UnsupportedError, match="run.. before plan"):
        w.run(q, (kc, vc))
    w.plan([[0, 1], [2, 3]], [20, 30], 4, 2, 64, 16)
    with pytest.raises(ferrattn.ShapeError, match=r"q has shape \[3, 4, 64\] but the plan is for \[2, 4, 64\]"):
        w.run(np.zeros((3, 4, 64), np.float32), (kc, vc))
    with pytest.raises(ferrattn.ShapeError, match=r"k_cache has shape \[8, 32, 2, 64\]"):
        w.run(q, (np.zeros((8, 32, 2, 64), np.float32), vc))
    with pytest.raises(ferrattn.ShapeError, match="v_cache holds 7 pages but k_cache holds 8"):
        w.run(q, (kc, vc[:7]))
    with pytest.raises(ferrattn.DTypeError, match="v_cache has dtype f16"):
        w.run(q, (kc, vc.astype(np.float16)))
    with pytest.raises(ferrattn.DTypeError, match="page_table has dtype f32; expected int32"):
        w.plan(np.zeros((2, 2), np.float32), [20, 30], 4, 2, 64, 16)
    with pytest.raises(ferrattn.ShapeError, match="seq_lens has 3 entries but page_table has 2 rows"):
        w.plan([[0, 1], [2, 3]], [20, 30, 1], 4, 2, 64, 16)
    with pytest.raises(ferrattn.ShapeError, match="k has 3 heads but q has 4"):
        w.plan([[0, 1], [2, 3]], [20, 30], 4, 3, 64, 16)


def test_turbo_cache_misuse():
    cache = ferrattn.TurboCache(1, 2, 64)
    with pytest.raises(ferrattn.UnsupportedError, match="call prefill"):
        cache.decode(np.zeros((1, 1, 4, 64), np.float32))
    with pytest.raises(ferrattn.UnsupportedError, match='kv_bits="int3"'):
        ferrattn.TurboCache(1, 2, 64, kv_bits="int3")
    with pytest.raises(ferrattn.ShapeError, match=r"kv_bits has 3 entries \(\[4, 2, 4\]\); one per KV head \(2\)"):
        ferrattn.TurboCache(1, 2, 64, kv_bits=[4, 2, 4])
    rng = np.random.default_rng(2)
    k = rng.standard_normal((1, 8, 2, 64)).astype(np.float32)
    cache.prefill(rng.standard_normal((1, 8, 4, 64)).astype(np.float32), k, k)
    with pytest.raises(ferrattn.ShapeError, match=r"k has shape \[1, 2, 2, 64\] but the cache is for \[1, 1, 2, 64\]"):
        cache.append(k[:, :2], k[:, :2])
    with pytest.raises(ferrattn.ShapeError, match=r"q has shape \[1, 1, 3, 64\]"):
        cache.decode(np.zeros((1, 1, 3, 64), np.float32))


def test_cuda_tensors_of_a_missing_device_raise_instead_of_reading():
    # every tensor claims cuda:7 (no machine this runs on has 8 GPUs): nothing may be
    # dereferenced; the call must fail on the device it cannot open
    t = lambda shape, bits=16: probe_tensor(shape, DL_FLOAT, bits, device_type=DL_CUDA, device_id=7)
    with pytest.raises(ferrattn.BackendError, match="cuda"):
        ferrattn.attention(
            t([1, 1, 4, 64]), t([1, 16, 2, 64]), t([1, 16, 2, 64]), algo="lean",
            out=t([1, 1, 4, 64]), lse=t([1, 4, 1], 32), return_lse=True,
        )
