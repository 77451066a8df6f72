"""torch on the CPU: tensors in and out, bf16, the custom op, torch.compile, and a Hugging Face
model running on the registered attention functions. Skipped where torch (or transformers) is
not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ferrattn  # noqa: E402  (after the skip: torch must be imported first for the hook test)
from conftest import compare, reference  # noqa: E402


def tensors(seed, b=2, sq=1, sk=77, hq=8, hk=2, d=64, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=g).to(dtype) for s in ((b, sq, hq, d), (b, sk, hk, d), (b, sk, hk, d)))


def test_torch_in_torch_out():
    q, k, v = tensors(0)
    o, lse = ferrattn.attention(q, k, v, algo="lean", return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32 and o.shape == (2, 1, 8, 64)
    assert lse.dtype == torch.float32 and lse.shape == (2, 8, 1)
    ro, rl = reference(q.numpy(), k.numpy(), v.numpy())
    assert compare(o.numpy(), ro).max_abs < 2e-5
    on = ferrattn.attention(q.numpy(), k.numpy(), v.numpy(), algo="lean")
    np.testing.assert_array_equal(o.numpy(), on)


def test_bf16_is_widened_exactly_and_rounded_back():
    q, k, v = tensors(1, dtype=torch.bfloat16)
    o = ferrattn.attention(q, k, v)
    o32 = ferrattn.attention(q.float(), k.float(), v.float())
    assert o.dtype == torch.bfloat16
    assert torch.equal(o, o32.to(torch.bfloat16))


def test_requires_grad_inputs_and_caller_outputs():
    q, k, v = tensors(2)
    q.requires_grad_(True)
    out = torch.empty(2, 1, 8, 64)
    lse = torch.empty(2, 8, 1)
    r = ferrattn.attention(q, k, v, return_lse=True, out=out, lse=lse)
    assert r[0] is out and r[1] is lse
    assert torch.equal(out, ferrattn.attention(q.detach(), k, v))


def test_errors_name_torch_dtypes():
    q, k, v = tensors(3)
    with pytest.raises(ferrattn.DTypeError, match="q has dtype float64"):
        ferrattn.attention(q.double(), k, v)
    with pytest.raises(ferrattn.LayoutError, match="last axis must have stride 1"):
        ferrattn.attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v)


def test_custom_op_is_registered_and_matches():
    assert hasattr(torch.ops.ferrattn, "attention")
    q, k, v = tensors(4)
    o, lse = torch.ops.ferrattn.attention(q, k, v, "exact", True, None)
    ro, rl = ferrattn.attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o, ro) and torch.equal(lse, rl)
    torch.library.opcheck(torch.ops.ferrattn.attention.default, (q, k, v, "exact", False, None))


def test_torch_compile_traces_one_op():
    q, k, v = tensors(5)

    def f(q, k, v):
        return ferrattn.attention(q * 2.0, k, v, algo="exact") + 1.0

    # fullgraph: a graph break (e.g. tracing into __dlpack__) would raise
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))


def test_torch_registration_happens_on_torch_import_only():
    import subprocess
    import sys

    code = (
        "import ferrattn, sys; assert 'torch' not in sys.modules; "
        "import torch; print(hasattr(torch.ops.ferrattn, 'attention'))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def tiny_llama(attn):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


@pytest.mark.parametrize("name", ["ferrattn_exact", "ferrattn_lean", "ferrattn_turbo"])
def test_transformers_model_runs_on_ferrattn(name):
    pytest.importorskip("transformers")
    import transformers  # noqa: F401  (registers the names through the import hook)

    from ferrattn import hf

    assert hf.registered()
    ref = tiny_llama("eager")
    model = tiny_llama(name)
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 128, (1, 70), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits
        got = model(ids).logits
        # a decode step through the KV cache: one query token against 70 keys
        past = model(ids[:, :-1], use_cache=True).past_key_values
        step = model(ids[:, -1:], past_key_values=past).logits[:, -1]
    c = compare(got.numpy(), want.numpy())
    s = compare(step.numpy(), want[:, -1].numpy())
    if name == "ferrattn_turbo":
        # INT8 attention (about 2% error per call on N(0, 1)-like activations, TURBO_INT8 in
        # test_cpu.py) moves the logits of a random model a little
        assert c.cosine > 0.99 and s.cosine > 0.99, (c, s)
    else:
        assert c.max_abs < 1e-4 and s.max_abs < 1e-4, (c, s)
