"""Other DLPack producers: jax on the host (skipped where jax is absent). The result comes back
as an array of the caller's framework."""

from __future__ import annotations

import numpy as np
import pytest

import ferrattn
from conftest import compare, reference

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
# jax puts arrays on its default device, a GPU where one exists; these tests are about host arrays
CPU = jax.devices("cpu")[0]


def host(x, dtype=None):
    return jax.device_put(jnp.asarray(x, dtype=dtype), CPU)


def test_jax_arrays_in_and_out():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 1, 8, 64), (2, 77, 2, 64), (2, 77, 2, 64)))
    o, lse = ferrattn.attention(host(q), host(k), host(v), algo="lean", return_lse=True)
    assert type(o).__module__.split(".")[0] in ("jax", "jaxlib")
    ro, rl = reference(q, k, v)
    assert compare(np.asarray(o), ro).max_abs < 2e-5
    assert compare(np.asarray(lse), rl).max_abs < 2e-5
    np.testing.assert_array_equal(np.asarray(o), ferrattn.attention(q, k, v, algo="lean"))


def test_jax_bf16():
    rng = np.random.default_rng(1)
    q, k, v = (host(rng.standard_normal(s), jnp.bfloat16) for s in ((1, 1, 4, 64), (1, 20, 4, 64), (1, 20, 4, 64)))
    o = ferrattn.attention(q, k, v)
    assert o.dtype == jnp.bfloat16
    o32 = ferrattn.attention(*(x.astype(jnp.float32) for x in (q, k, v)))
    np.testing.assert_array_equal(np.asarray(o), np.asarray(o32.astype(jnp.bfloat16)))
