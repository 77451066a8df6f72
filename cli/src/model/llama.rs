//! A Llama decoder (Touvron et al. 2023, as SmolLM2 uses it) over GGUF weights, in `f32`, with
//! the attention step left to a [`KvAttention`].
//!
//! Per layer: `h = x + Wo · attn(RoPE(Wq · n1), RoPE(Wk · n1), Wv · n1)` with
//! `n1 = RMSNorm(x)`, then `x' = h + Wd · (silu(Wg · n2) ⊙ Wu · n2)` with `n2 = RMSNorm(h)`;
//! the logits are `E · RMSNorm(x_L)` with the token embedding `E` (tied, as SmolLM2 ties it, when
//! the file has no `output.weight`). Weights are dequantised once at load, so the model runs on
//! exactly the values the Q4_1 file encodes.

use super::gguf::Gguf;
use super::ops::{matmul, rms_norm, rope, swiglu};
use super::ModelError;
use crate::error::Result;
use ferrattn_core::{DType, Tensor};

/// Hyper-parameters read from the GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Decoder layers.
    pub layers: usize,
    /// Residual width.
    pub hidden: usize,
    /// SwiGLU inner width.
    pub ffn: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (GQA).
    pub heads_kv: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base θ.
    pub rope_base: f32,
    /// RMSNorm ε.
    pub norm_eps: f32,
    /// Longest context the model was trained for.
    pub context: usize,
}

impl LlamaConfig {
    /// Reads and checks the `llama.*` metadata.
    pub fn from_gguf(g: &Gguf) -> Result<LlamaConfig, ModelError> {
        let arch = g.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(ModelError::Unsupported(format!(
                "general.architecture {arch:?}; this forward implements \"llama\""
            )));
        }
        let hidden = g.get_usize("llama.embedding_length")?;
        let heads_q = g.get_usize("llama.attention.head_count")?;
        let heads_kv = g.get_usize("llama.attention.head_count_kv")?;
        if heads_q == 0
            || heads_kv == 0
            || !heads_q.is_multiple_of(heads_kv)
            || !hidden.is_multiple_of(heads_q)
        {
            return Err(ModelError::Unsupported(format!(
                "{heads_q} query heads, {heads_kv} KV heads, width {hidden}: query heads must be a multiple of KV heads and divide the width"
            )));
        }
        let vocab = match g.get_usize("llama.vocab_size") {
            Ok(v) => v,
            Err(ModelError::MissingKey(_)) => g.get_array("tokenizer.ggml.tokens")?.len(),
            Err(e) => return Err(e),
        };
        Ok(LlamaConfig {
            layers: g.get_usize("llama.block_count")?,
            hidden,
            ffn: g.get_usize("llama.feed_forward_length")?,
            heads_q,
            heads_kv,
            head_dim: hidden / heads_q,
            vocab,
            rope_base: g.get_f32("llama.rope.freq_base").unwrap_or(10000.0),
            norm_eps: g.get_f32("llama.attention.layer_norm_rms_epsilon")?,
            context: g.get_usize("llama.context_length")?,
        })
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    ffn_norm: Vec<f32>,
    w_gate: Vec<f32>,
    w_up: Vec<f32>,
    w_down: Vec<f32>,
}

/// The model: configuration and dequantised weights.
pub struct Llama {
    /// Hyper-parameters.
    pub cfg: LlamaConfig,
    embed: Vec<f32>,
    output: Option<Vec<f32>>,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
}

/// The attention step of every layer, with whatever KV cache it keeps. One value serves one
/// sequence: [`KvAttention::prefill`] is called once per layer on an empty cache, then
/// [`KvAttention::decode`] once per layer per new token.
///
/// Tensors are `[1, n, heads, head_dim]` in `f32` (`q` with the query heads, `k` and `v` with the
/// KV heads), after RoPE; the result is O `[1, n, heads_q, head_dim]` flattened. Attention is
/// causal: token `i` of a prefill sees keys `0..=i`, a decode token sees the whole cache and
/// itself.
pub trait KvAttention {
    /// Prefill of `n` tokens at positions `0..n` in `layer`.
    fn prefill(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>>;
    /// One token appended after everything the layer's cache holds.
    fn decode(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>>;
}

impl Llama {
    /// Reads the configuration and dequantises every weight.
    pub fn from_gguf(g: &Gguf) -> Result<Llama, ModelError> {
        let cfg = LlamaConfig::from_gguf(g)?;
        let (h, f, kv) = (cfg.hidden, cfg.ffn, cfg.heads_kv * cfg.head_dim);
        let t = |name: String, dims: &[usize]| g.tensor_f32(&name, dims);
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: t(n("attn_norm"), &[h])?,
                wq: t(n("attn_q"), &[h, h])?,
                wk: t(n("attn_k"), &[h, kv])?,
                wv: t(n("attn_v"), &[h, kv])?,
                wo: t(n("attn_output"), &[h, h])?,
                ffn_norm: t(n("ffn_norm"), &[h])?,
                w_gate: t(n("ffn_gate"), &[h, f])?,
                w_up: t(n("ffn_up"), &[h, f])?,
                w_down: t(n("ffn_down"), &[f, h])?,
            });
        }
        let output = match g.tensor_f32("output.weight", &[h, cfg.vocab]) {
            Ok(w) => Some(w),
            Err(ModelError::MissingTensor(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(Llama {
            embed: t("token_embd.weight".into(), &[h, cfg.vocab])?,
            output,
            output_norm: t("output_norm.weight".into(), &[h])?,
            layers,
            cfg,
        })
    }

    /// Logits `[tokens.len(), vocab]` of `tokens` placed at positions `start..`: a prefill when
    /// `start == 0`, otherwise one decode step (exactly one token). `observe` sees each layer's
    /// Q, K, V after RoPE (for capturing activations).
    pub fn forward(
        &self,
        tokens: &[u32],
        start: usize,
        attn: &mut dyn KvAttention,
        observe: &mut dyn FnMut(usize, &Tensor, &Tensor, &Tensor),
    ) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let n = tokens.len();
        if n == 0 || (start > 0 && n != 1) {
            return Err(ModelError::Unsupported(format!(
                "a forward of {n} tokens at position {start}: a prefill starts at 0, a decode step is one token"
            ))
            .into());
        }
        if start + n > c.context {
            return Err(ModelError::Unsupported(format!(
                "positions up to {} exceed the model's context of {}",
                start + n,
                c.context
            ))
            .into());
        }
        let (h, d) = (c.hidden, c.head_dim);
        let kvw = c.heads_kv * d;
        let mut x = Vec::with_capacity(n * h);
        for &t in tokens {
            let t = t as usize;
            if t >= c.vocab {
                return Err(ModelError::Tokenizer(format!(
                    "token id {t} is outside the vocabulary of {}",
                    c.vocab
                ))
                .into());
            }
            x.extend_from_slice(&self.embed[t * h..(t + 1) * h]);
        }
        let tensor = |data: Vec<f32>, heads: usize| Tensor {
            shape: vec![1, n, heads, d],
            dtype: DType::F32,
            data,
        };
        for (l, w) in self.layers.iter().enumerate() {
            let a = rms_norm(&x, &w.attn_norm, c.norm_eps);
            let mut q = matmul(&a, n, &w.wq, h, h);
            let mut k = matmul(&a, n, &w.wk, h, kvw);
            let v = matmul(&a, n, &w.wv, h, kvw);
            rope(&mut q, c.heads_q, d, start, c.rope_base);
            rope(&mut k, c.heads_kv, d, start, c.rope_base);
            let (q, k, v) = (
                tensor(q, c.heads_q),
                tensor(k, c.heads_kv),
                tensor(v, c.heads_kv),
            );
            observe(l, &q, &k, &v);
            let o = if start == 0 {
                attn.prefill(l, q, k, v)?
            } else {
                attn.decode(l, q, k, v)?
            };
            let o = matmul(&o, n, &w.wo, h, h);
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let a = rms_norm(&x, &w.ffn_norm, c.norm_eps);
            let mut g = matmul(&a, n, &w.w_gate, h, c.ffn);
            let u = matmul(&a, n, &w.w_up, h, c.ffn);
            swiglu(&mut g, &u);
            let dn = matmul(&g, n, &w.w_down, c.ffn, h);
            x.iter_mut().zip(&dn).for_each(|(x, o)| *x += o);
        }
        let xn = rms_norm(&x, &self.output_norm, c.norm_eps);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        Ok(matmul(&xn, n, head, h, c.vocab))
    }
}
