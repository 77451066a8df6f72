#!/usr/bin/env python3
"""Independent check of ferrattn's SmolLM2 forward and tokenizer (issue 13).

Holds what `ferrattn repro model-accuracy --dump-reference FILE` wrote against code that shares
nothing with the Rust side:
- weights read and dequantised by the `gguf` PyPI package (llama.cpp's own Python reader);
- the tokenizer rebuilt in HuggingFace `tokenizers` (its Rust BPE and real regex engine) from the
  GGUF vocabulary and merges, with SmolLM2's pre-tokenizer (Digits(individual) + ByteLevel);
- a numpy Llama forward in float64 written the HuggingFace way: the GGUF converter's Q/K row
  permutation undone (as transformers' GGUF loader does) and RoPE applied in the rotate-half
  (NeoX) layout, where the Rust code keeps the GGUF layout and rotates adjacent pairs.

Prints the token agreement and the logits difference (max abs, relative Frobenius, argmax
agreement). Needs numpy, gguf, tokenizers (`pip install numpy gguf tokenizers`; no torch).

Usage:
  ferrattn repro model-accuracy --tokens 256 --dump-reference /tmp/ref.safetensors
  python3 scripts/check-model-numpy.py --model .models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --dump /tmp/ref.safetensors --text ../shared/papers/turboattention-paper.txt
"""
import argparse
import json
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken

PROMPTS = [
    "What is the capital of France, and what is it famous for?",
    "Explain in simple terms why the sky is blue.",
    "Write a short poem about the sea.",
    "Give three tips for writing clean code.",
    "How does a computer store numbers in memory?",
]
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            "<|im_start|>assistant\n")


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32, "I64": np.int64}[h["dtype"]]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(h["shape"])
    return out


def field(r, key):
    f = r.fields[key]
    return f.contents()


def build_tokenizer(r):
    tokens = field(r, "tokenizer.ggml.tokens")
    merges = field(r, "tokenizer.ggml.merges")
    types = field(r, "tokenizer.ggml.token_type")
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty in (3, 4)])
    return tok


def weights(r):
    w = {}
    for t in r.tensors:
        a = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = a.reshape([int(x) for x in reversed(t.shape)])
    return w


def unpermute(w, heads):
    # llama.cpp's convert_hf_to_gguf permutes Q/K rows so that RoPE pairs are adjacent; undo it
    # to get the HuggingFace row order, where pairs are (i, i + d/2) (transformers does the same)
    rows, cols = w.shape
    d = rows // heads
    return w.reshape(heads, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def rope_neox(x, base):
    # x [n, heads, d]; HuggingFace rotate_half
    n, _, d = x.shape
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
    rot = np.concatenate([-x[..., d // 2:], x[..., :d // 2]], axis=-1)
    return x * cos + rot * sin


def forward(r, w, ids):
    L = int(field(r, "llama.block_count"))
    hq = int(field(r, "llama.attention.head_count"))
    hk = int(field(r, "llama.attention.head_count_kv"))
    base = float(field(r, "llama.rope.freq_base"))
    eps = float(field(r, "llama.attention.layer_norm_rms_epsilon"))
    emb = w["token_embd.weight"]
    hidden = emb.shape[1]
    d = hidden // hq
    n = len(ids)

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    x = emb[ids]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        a = norm(x, w[p + "attn_norm.weight"])
        q = (a @ unpermute(w[p + "attn_q.weight"], hq).T).reshape(n, hq, d)
        k = (a @ unpermute(w[p + "attn_k.weight"], hk).T).reshape(n, hk, d)
        v = (a @ w[p + "attn_v.weight"].T).reshape(n, hk, d)
        q, k = rope_neox(q, base), rope_neox(k, base)
        k = np.repeat(k, hq // hk, axis=1)
        v = np.repeat(v, hq // hk, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hqk,khd->qhd", s, v).reshape(n, hidden)
        x = x + o @ w[p + "attn_output.weight"].T
        a = norm(x, w[p + "ffn_norm.weight"])
        g = a @ w[p + "ffn_gate.weight"].T
        u = a @ w[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    x = norm(x, w["output_norm.weight"])
    head = w.get("output.weight", emb)
    return x @ head.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dump", required=True)
    ap.add_argument("--text", required=True)
    args = ap.parse_args()
    r = GGUFReader(args.model)
    dump = read_safetensors(args.dump)
    rust_tokens = dump["tokens"].astype(np.int64)
    n = len(rust_tokens)

    tok = build_tokenizer(r)
    text = open(args.text, encoding="utf-8").read()
    hf = tok.encode(text, add_special_tokens=False).ids
    same_text = list(hf[:n]) == rust_tokens.tolist()
    print(f"tokenizer: text, first {n} tokens identical to HF tokenizers: {same_text}")
    if "all_tokens" in dump:
        whole = list(hf) == dump["all_tokens"].tolist()
        print(f"tokenizer: whole text ({len(hf)} tokens) identical: {whole}")
        same_text &= whole
    ok = same_text
    for i, p in enumerate(PROMPTS):
        key = f"prompt{i}"
        if key in dump:
            same = tok.encode(chat(p), add_special_tokens=False).ids == dump[key].tolist()
            print(f"tokenizer: prompt {i} identical: {same}")
            ok &= same
    if not same_text:
        first = next(i for i, (a, b) in enumerate(zip(hf, rust_tokens)) if a != b)
        print(f"  first difference at {first}: hf {hf[first:first + 5]} rust {rust_tokens[first:first + 5]}")

    w = weights(r)
    ref = forward(r, w, rust_tokens)
    got = dump["logits"].astype(np.float64)
    diff = np.abs(got - ref)
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    agree = (got.argmax(-1) == ref.argmax(-1)).mean()
    print(f"logits [{n} x {ref.shape[1]}]: max |rust f32 - numpy f64| = {diff.max():.3e} "
          f"(logit range {ref.min():.1f} .. {ref.max():.1f}), mean {diff.mean():.3e}, "
          f"relative Frobenius {rel:.3e}, argmax agreement {100 * agree:.2f}%")
    return 0 if ok and rel < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
