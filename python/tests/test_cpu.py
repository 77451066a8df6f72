"""Every algorithm on host tensors: against the float64 numpy reference (tolerances per
algorithm, stated where they come from) and against the Rust CLI's CPU emulation (bit for bit).
numpy alone is enough."""

from __future__ import annotations

import numpy as np
import pytest

import ferrattn
from conftest import compare, randn, reference

# Exact and Lean compute in f32 with online softmax over f32 inputs: a few f32 ulps of O.
F32_TOL = 2e-5
# TurboAttention prefill, INT8 Q/K/V and P: core/src/turbo/tests.rs derives about 2% relative
# Frobenius error for N(0, 1) inputs and bounds it at 4%, cosine 0.999, LSE 0.05.
TURBO_INT8 = dict(rel_fro=0.04, cosine=0.999, lse=0.05)
# TurboAttention decode over 4-bit channelwise blocks: derived 13.7%, bound 20%, cosine 0.98,
# LSE 0.15 (same file).
TURBO_INT4 = dict(rel_fro=0.20, cosine=0.98, lse=0.15)
# TurboQuant defaults (4-bit keys = 3-bit codebook + QJL, 3-bit values): below the all-3-bit
# case, whose error model in core/src/turboquant/tests.rs predicts 0.48 (measured 0.47) and
# which that test accepts up to 1.25x the prediction.
TURBOQUANT = dict(rel_fro=0.6, cosine=0.8)


def inputs(seed, b=2, sq=1, sk=77, hq=8, hk=2, d=64, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return randn(rng, (b, sq, hq, d), dtype), randn(rng, (b, sk, hk, d), dtype), randn(rng, (b, sk, hk, d), dtype)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 1, 1, 1, 64),  # one key
        (2, 3, 65, 8, 2, 64),  # tile-missing length, GQA 4
        (1, 37, 63, 4, 4, 128),  # MHA, Sq < Sk
    ],
)
def test_exact_matches_numpy_and_cli(shape, causal, cli):
    b, sq, sk, hq, hk, d = shape
    q, k, v = inputs(1, b, sq, sk, hq, hk, d)
    o, lse = ferrattn.attention(q, k, v, algo="exact", causal=causal, return_lse=True)
    assert isinstance(o, np.ndarray) and o.dtype == np.float32 and o.shape == (b, sq, hq, d)
    assert lse.dtype == np.float32 and lse.shape == (b, hq, sq)
    ro, rl = reference(q, k, v, causal)
    assert compare(o, ro).max_abs < F32_TOL, compare(o, ro)
    assert compare(lse, rl).max_abs < F32_TOL, compare(lse, rl)
    co, cl = cli("exact", q, k, v, causal=causal)
    np.testing.assert_array_equal(o, co)
    np.testing.assert_array_equal(lse, cl)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("sq,causal", [(1, False), (4, True)])
def test_lean_matches_numpy_and_cli(dtype, sq, causal, cli):
    q, k, v = inputs(2, 3, sq, 577, 8, 2, 128, dtype)
    o, lse = ferrattn.attention(q, k, v, algo="lean", causal=causal, return_lse=True)
    assert o.dtype == dtype
    ro, rl = reference(q, k, v, causal)
    # f16 output: half an f16 ulp of values of magnitude below 1 is 2^-12
    tol = F32_TOL if dtype == np.float32 else 2.0**-11
    assert compare(o, ro).max_abs < tol, compare(o, ro)
    assert compare(lse, rl).max_abs < 1e-4, compare(lse, rl)
    co, cl = cli("lean", q, k, v, causal=causal)
    np.testing.assert_array_equal(o, co)
    np.testing.assert_array_equal(lse, cl)


@pytest.mark.parametrize("causal", [True, False])
def test_turbo_prefill_within_int8_bounds_and_equals_cli(causal, cli):
    q, k, v = inputs(3, 2, 130, 130, 4, 2, 64)
    o, lse = ferrattn.attention(q, k, v, algo="turbo", causal=causal, return_lse=True)
    ro, rl = reference(q, k, v, causal)
    c = compare(o, ro)
    assert c.rel_fro < TURBO_INT8["rel_fro"] and c.cosine > TURBO_INT8["cosine"], c
    assert compare(lse, rl).max_abs < TURBO_INT8["lse"], compare(lse, rl)
    co, cl = cli("turbo", q, k, v, causal=causal)
    np.testing.assert_array_equal(o, co)
    np.testing.assert_array_equal(lse, cl)


def test_turboquant_within_bounds_and_equals_cli(cli):
    q, k, v = inputs(4, 2, 2, 256, 8, 2, 64)
    o, lse = ferrattn.attention(q, k, v, algo="turboquant", return_lse=True)
    c = compare(o, reference(q, k, v)[0])
    assert c.rel_fro < TURBOQUANT["rel_fro"] and c.cosine > TURBOQUANT["cosine"], c
    co, cl = cli("turboquant", q, k, v)
    np.testing.assert_array_equal(o, co)
    np.testing.assert_array_equal(lse, cl)


def test_softmax_scale_and_no_lse_by_default():
    q, k, v = inputs(5)
    o = ferrattn.attention(q, k, v, softmax_scale=0.3)
    assert isinstance(o, np.ndarray)
    assert compare(o, reference(q, k, v, scale=0.3)[0]).max_abs < F32_TOL


def test_outputs_written_into_caller_tensors():
    q, k, v = inputs(6)
    out = np.full((2, 1, 8, 64), np.nan, np.float32)
    lse = np.full((2, 8, 1), np.nan, np.float32)
    o2, l2 = ferrattn.attention(q, k, v, return_lse=True, out=out, lse=lse)
    assert o2 is out and l2 is lse
    ro, rl = reference(q, k, v)
    assert compare(out, ro).max_abs < F32_TOL
    assert compare(lse, rl).max_abs < F32_TOL
    # a flat buffer with room to spare (engines pass one per step), and a strided output
    flat = np.full(2 * 8 * 64 + 5, np.nan, np.float32)
    ferrattn.attention(q, k, v, out=flat)
    np.testing.assert_array_equal(flat[: 2 * 8 * 64].reshape(2, 1, 8, 64), out)
    assert np.isnan(flat[-5:]).all(), "past the output nothing is written"
    wide = np.full((2, 1, 8, 128), np.nan, np.float32)
    ferrattn.attention(q, k, v, out=wide[..., :64])
    np.testing.assert_array_equal(wide[..., :64], out)
    assert np.isnan(wide[..., 64:]).all()


def test_strided_inputs_are_read_through_their_strides():
    # q sliced out of a fused [B, S, 3, H, D] projection, as engines hold it
    rng = np.random.default_rng(7)
    qkv = randn(rng, (2, 5, 3, 4, 64))
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    o = ferrattn.attention(q, k, v, causal=True)
    qc, kc, vc = (np.ascontiguousarray(t) for t in (q, k, v))
    np.testing.assert_array_equal(o, ferrattn.attention(qc, kc, vc, causal=True))


def test_f16_output_rounds_the_f32_result():
    q, k, v = inputs(8, dtype=np.float16)
    o = ferrattn.attention(q, k, v)
    o32 = ferrattn.attention(*(t.astype(np.float32) for t in (q, k, v)))
    assert o.dtype == np.float16
    np.testing.assert_array_equal(o, o32.astype(np.float16))


def paged(rng, seq_lens, page_size, hk, d, num_pages, dtype=np.float32):
    """A shuffled page pool holding each sequence's keys, its page table, and the contiguous
    (padded) K and V the pages spell out."""
    b = len(seq_lens)
    max_pages = max(-(-n // page_size) for n in seq_lens) + 1
    kc = randn(rng, (num_pages, page_size, hk, d), dtype)
    vc = randn(rng, (num_pages, page_size, hk, d), dtype)
    free = list(rng.permutation(num_pages))
    table = np.full((b, max_pages), -1, np.int32)  # unused slots hold garbage (-1)
    smax = max(seq_lens)
    k = np.zeros((b, smax, hk, d), dtype)
    v = np.zeros((b, smax, hk, d), dtype)
    for s, n in enumerate(seq_lens):
        for j in range(-(-n // page_size)):
            p = free.pop()
            table[s, j] = p
            t = min(page_size, n - j * page_size)
            k[s, j * page_size : j * page_size + t] = kc[p, :t]
            v[s, j * page_size : j * page_size + t] = vc[p, :t]
    return kc, vc, table, k, v


@pytest.mark.parametrize("page_size", [16, 64])
def test_paged_decode_matches_contiguous_numpy_and_cli(page_size, cli):
    rng = np.random.default_rng(9)
    seq_lens = [1, 100, 577]
    hq, hk, d = 8, 2, 128
    kc, vc, table, k, v = paged(rng, seq_lens, page_size, hk, d, num_pages=64)
    q = randn(rng, (3, hq, d))
    w = ferrattn.BatchDecodeWithPagedKVCacheWrapper()
    w.plan(table, seq_lens, hq, hk, d, page_size)
    out, lse = w.run(q, (kc, vc))
    assert out.shape == (3, hq, d) and lse.shape == (3, hq)
    ro, rl = reference(q[:, None], k, v, seqlens_k=seq_lens)
    assert compare(out, ro[:, 0]).max_abs < F32_TOL, compare(out, ro[:, 0])
    assert compare(lse, rl[:, :, 0]).max_abs < F32_TOL
    co, cl = cli("lean", q[:, None], k, v, seqlens_k=seq_lens)
    np.testing.assert_array_equal(out, co[:, 0])
    np.testing.assert_array_equal(lse, cl[:, :, 0])
    # the combined [num_pages, 2, page_size, Hk, D] layout reads the same pages
    kv = np.stack([kc, vc], axis=1)
    out2, lse2 = w.run(q, kv)
    np.testing.assert_array_equal(out2, out)
    # int64 tables (as engines often keep them) are narrowed after a range check
    w64 = ferrattn.BatchDecodeWithPagedKVCacheWrapper()
    w64.plan(table.astype(np.int64), np.asarray(seq_lens, np.int64), hq, hk, d, page_size)
    np.testing.assert_array_equal(w64.run(q, (kc, vc))[0], out)
    with pytest.raises(ferrattn.PageTableError, match="outside int32"):
        w64.plan(table.astype(np.int64) + 2**31, seq_lens, hq, hk, d, page_size)
    # run per layer with the same plan, into fixed buffers
    o_buf, l_buf = np.empty_like(out), np.empty_like(lse)
    r = w.run(q, (kc, vc), out=o_buf, lse=l_buf)
    assert r[0] is o_buf and r[1] is l_buf
    np.testing.assert_array_equal(o_buf, out)


def test_lse_is_natural_log():
    # one key: softmax normaliser exp(scale q.k), so lse = scale q.k exactly in natural log
    rng = np.random.default_rng(10)
    q, k, v = randn(rng, (1, 1, 1, 64)), randn(rng, (1, 1, 1, 64)), randn(rng, (1, 1, 1, 64))
    _, lse = ferrattn.attention(q, k, v, return_lse=True)
    want = float(q[0, 0, 0].astype(np.float64) @ k[0, 0, 0] / 8.0)
    assert abs(float(lse[0, 0, 0]) - want) < 1e-5


def turbo_session(cache, q, k, v, ctx):
    """Prefill of the first ``ctx`` tokens, then per step append one token and decode its query."""
    o, lse = cache.prefill(q[:, :ctx], k[:, :ctx], v[:, :ctx], causal=True)
    outs = []
    for t in range(ctx, k.shape[1]):
        cache.append(k[:, t : t + 1], v[:, t : t + 1])
        outs.append(cache.decode(q[:, t : t + 1]))
    return (o, lse), outs


def test_turbo_cache_prefill_append_decode_equals_attention():
    """TurboCache steps reproduce attention(algo="turbo") on the same tokens bit for bit: its
    prefill is Alg. 1, and attention with Sq < Sk compresses the first Sk - Sq keys and then
    appends and decodes causally, one token at a time (Alg. 2), as the cache's steps do."""
    rng = np.random.default_rng(11)
    b, ctx, steps, hq, hk, d = 2, 70, 3, 4, 2, 64
    sk = ctx + steps
    q, k, v = randn(rng, (b, sk, hq, d)), randn(rng, (b, sk, hk, d)), randn(rng, (b, sk, hk, d))
    cache = ferrattn.TurboCache(b, hk, d)  # the paper's mixed 2/4 bits, as attention() plans
    (o, lse), outs = turbo_session(cache, q, k, v, ctx)
    po, pl = ferrattn.attention(q[:, :ctx], k[:, :ctx], v[:, :ctx], algo="turbo", causal=True, return_lse=True)
    np.testing.assert_array_equal(o, po)
    np.testing.assert_array_equal(lse, pl)
    assert sorted(cache.bits) == [2, 4] and cache.seq_len(1) == sk
    ao, al = ferrattn.attention(q[:, ctx:], k, v, algo="turbo", causal=True, return_lse=True)
    for i, (so, sl) in enumerate(outs):
        np.testing.assert_array_equal(so[:, 0], ao[:, i])
        np.testing.assert_array_equal(sl[:, :, 0], al[:, :, i])
    m = cache.memory()
    assert m["tokens"] == b * sk and m["fp16_bytes"] == b * sk * hk * d * 2 * 2
    assert m["compression_ratio"] > 1.0


def test_turbo_cache_int4_decode_within_4bit_bounds():
    rng = np.random.default_rng(14)
    b, ctx, steps, hq, hk, d = 2, 192, 4, 4, 2, 64
    sk = ctx + steps
    q, k, v = randn(rng, (b, sk, hq, d)), randn(rng, (b, sk, hk, d)), randn(rng, (b, sk, hk, d))
    cache = ferrattn.TurboCache(b, hk, d, kv_bits="int4")
    _, outs = turbo_session(cache, q, k, v, ctx)
    assert cache.bits == [4, 4]
    ro, rl = reference(q[:, ctx:], k, v, causal=True)
    o = np.stack([s[0][:, 0] for s in outs], axis=1)
    lse = np.stack([s[1][:, :, 0] for s in outs], axis=2)
    c = compare(o, ro)
    assert c.rel_fro < TURBO_INT4["rel_fro"] and c.cosine > TURBO_INT4["cosine"], c
    assert compare(lse, rl).max_abs < TURBO_INT4["lse"], compare(lse, rl)


def test_turbo_cache_flushes_its_buffer_into_a_block():
    rng = np.random.default_rng(12)
    cache = ferrattn.TurboCache(1, 1, 64, kv_bits="int2")
    k, v = randn(rng, (1, 63, 1, 64)), randn(rng, (1, 63, 1, 64))
    cache.prefill(randn(rng, (1, 63, 1, 64)), k, v)
    before = cache.memory()
    assert before["compressed_bytes"] == 0, "63 tokens stay in the INT8 buffer"
    cache.append(randn(rng, (1, 1, 1, 64)), randn(rng, (1, 1, 1, 64)))
    after = cache.memory()
    assert after["compressed_bytes"] > 0 and after["tokens"] == 64
    assert after["buffer_bytes"] < before["buffer_bytes"]


def test_rust_allocated_outputs_are_framework_arrays_that_own_their_memory():
    q, k, v = inputs(13)
    o = ferrattn.attention(q, k, v)
    del q, k, v
    assert o.flags.writeable and o.flags.c_contiguous
    o[...] = 1.0  # the memory is the array's (handed over through DLPack), not a temporary
    assert float(o.sum()) == o.size


def test_host_tensor_round_trips_through_dlpack_once():
    from ferrattn._ferrattn import probe_tensor

    t = probe_tensor([2, 3], 2, 32)
    a = np.from_dlpack(t)
    assert a.shape == (2, 3) and (a == 0).all()
    with pytest.raises(BufferError, match="already exported"):
        np.from_dlpack(t)


def test_import_does_not_pull_torch():
    import subprocess
    import sys

    code = "import sys, ferrattn; print('torch' in sys.modules, 'transformers' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


def test_turbo_cache_per_head_bits_on_the_host():
    """kv_bits as a list fixes each KV head's width (the form the CUDA cache takes): the host
    cache keeps it, and equals a "mixed" cache whose head split came out the same."""
    rng = np.random.default_rng(15)
    b, ctx, hq, hk, d = 1, 80, 4, 2, 64
    q, k, v = randn(rng, (b, ctx, hq, d)), randn(rng, (b, ctx, hk, d)), randn(rng, (b, ctx, hk, d))
    mixed = ferrattn.TurboCache(b, hk, d)
    mo, ml = mixed.prefill(q, k, v)
    fixed = ferrattn.TurboCache(b, hk, d, kv_bits=list(mixed.bits))
    fo, fl = fixed.prefill(q, k, v)
    assert fixed.bits == mixed.bits and sorted(fixed.bits) == [2, 4]
    np.testing.assert_array_equal(fo, mo)
    np.testing.assert_array_equal(fl, ml)
    assert fixed.memory() == mixed.memory()
    assert fixed.allocated_bytes() == 0, "a host cache holds no device memory"


def test_turboquant_cache_append_decode_equals_attention():
    """TurboQuantCache on host tensors: a prompt appended, then one token per step, each step's
    query decoded over everything held, equals attention(algo="turboquant") over the same tokens
    bit for bit (TurboQuant compresses every token alone, so appending equals compressing all at
    once), and stays within the TurboQuant bounds of the float64 reference."""
    rng = np.random.default_rng(21)
    b, ctx, steps, hq, hk, d = 2, 37, 3, 8, 2, 64
    sk = ctx + steps
    q, k, v = randn(rng, (b, steps, hq, d)), randn(rng, (b, sk, hk, d)), randn(rng, (b, sk, hk, d))
    cache = ferrattn.TurboQuantCache(b, hk, d)
    cache.append(k[:, :ctx], v[:, :ctx])
    assert cache.lens == [ctx, ctx] and cache.allocated_bytes() == 0
    for s in range(steps):
        t = ctx + s
        cache.append(k[:, t : t + 1], v[:, t : t + 1])
        o, lse = cache.decode(q[:, s : s + 1])
        assert o.shape == (b, 1, hq, d) and lse.shape == (b, hq, 1) and lse.dtype == np.float32
        ao, al = ferrattn.attention(q[:, s : s + 1], k[:, : t + 1], v[:, : t + 1], algo="turboquant", return_lse=True)
        np.testing.assert_array_equal(o, ao)
        np.testing.assert_array_equal(lse, al)
        c = compare(o, reference(q[:, s : s + 1], k[:, : t + 1], v[:, : t + 1])[0])
        assert c.rel_fro < TURBOQUANT["rel_fro"] and c.cosine > TURBOQUANT["cosine"], c
    assert cache.seq_len(1) == sk
    m = cache.memory()
    # device layout per token and KV head: d/2 key codes + d/8 signs + 4 norm bytes + d/2 value codes + 2
    assert m["tokens"] == b * sk and m["compressed_bytes"] == b * sk * hk * (32 + 8 + 4 + 32 + 2)
    assert m["fp16_bytes"] == b * sk * hk * d * 4 and m["compression_ratio"] > 3.0
    assert cache.config()["key_bits"] == 4 and cache.config()["key_qjl"] is True
    # outputs into the caller's arrays
    out, lse_out = np.empty((b, 1, hq, d), np.float32), np.empty((b, hq, 1), np.float32)
    r = cache.decode(q[:, :1], out=out, lse=lse_out)
    assert r[0] is out and r[1] is lse_out
    cache.reset()
    assert cache.lens == [0, 0]


def test_turboquant_cache_compress_on_the_host_is_the_exact_contract():
    """compress= on host tensors: the host cache is the CPU emulation, the exact contract.
    compress="exact" equals the default bit for bit; "fast" and "split" (CUDA tensor-core
    paths) are refused at the first host append with a message that says so, holding nothing;
    an unknown name is refused when the cache is made, with the three names."""
    rng = np.random.default_rng(23)
    b, ctx, hq, hk, d = 2, 21, 4, 2, 64
    q, k, v = randn(rng, (b, 1, hq, d)), randn(rng, (b, ctx, hk, d)), randn(rng, (b, ctx, hk, d))
    default, exact = ferrattn.TurboQuantCache(b, hk, d), ferrattn.TurboQuantCache(b, hk, d, compress="exact")
    assert default.compress is None and exact.compress == "exact"
    for c in (default, exact):
        c.append(k, v)
    assert default.compress == "exact" and exact.compress == "exact"
    do, dl = default.decode(q)
    eo, el = exact.decode(q)
    np.testing.assert_array_equal(do, eo)
    np.testing.assert_array_equal(dl, el)
    for path in ("fast", "split"):
        c = ferrattn.TurboQuantCache(b, hk, d, compress=path)
        assert c.compress == path
        with pytest.raises(ferrattn.UnsupportedError, match=f"compress='{path}'|compress=\"{path}\"") as e:
            c.append(k, v)
        assert "exact contract" in str(e.value) and "CUDA" in str(e.value), e.value
        assert isinstance(e.value, ValueError)
        assert c.lens == [0, 0]
    for bad in ("Fast", "fp16", ""):
        with pytest.raises(ferrattn.UnsupportedError, match='"exact", "fast" and "split"'):
            ferrattn.TurboQuantCache(b, hk, d, compress=bad)


def test_turboquant_cache_errors():
    rng = np.random.default_rng(22)
    k, v = randn(rng, (2, 5, 2, 64)), randn(rng, (2, 5, 2, 64))
    q = randn(rng, (2, 1, 8, 64))
    cache = ferrattn.TurboQuantCache(2, 2, 64)
    with pytest.raises(ferrattn.UnsupportedError, match="append"):
        cache.decode(q)
    with pytest.raises(ferrattn.ShapeError, match=r"k has shape \[2, 5, 3, 64\]"):
        cache.append(randn(rng, (2, 5, 3, 64)), randn(rng, (2, 5, 3, 64)))
    with pytest.raises(ferrattn.ShapeError, match=r"v has shape"):
        cache.append(k, v[:, :4])
    with pytest.raises(ferrattn.ShapeError, match=r"new_tokens >= 1"):
        cache.append(k[:, :0], v[:, :0])
    cache.append(k, v)
    with pytest.raises(ferrattn.ShapeError, match=r"q has shape \[2, 2, 8, 64\]"):
        cache.decode(randn(rng, (2, 2, 8, 64)))
    with pytest.raises(ferrattn.ShapeError):
        cache.decode(q, out=np.empty((2, 1, 8, 32), np.float32))
    with pytest.raises(ferrattn.UnsupportedError, match="key_bits = 7"):
        ferrattn.TurboQuantCache(2, 2, 64, key_bits=7)
    with pytest.raises(ferrattn.ShapeError, match="must be positive"):
        ferrattn.TurboQuantCache(0, 2, 64)
