//! The attention methods a model can run on, each with the KV cache its algorithm keeps.
//!
//! | method       | prefill                                         | decode step                                       | cache |
//! |--------------|-------------------------------------------------|---------------------------------------------------|-------|
//! | `Exact`      | exact attention (CPU backend, blocked softmax)  | exact attention over the cache                    | f32 K, V |
//! | `Lean`       | exact attention (Lean is a decode algorithm)    | stream-K decode (CPU backend, Lean Alg. 2)        | f32 K, V |
//! | `Turbo`      | TurboAttention Alg. 1 (INT8 Q/K/V, SAS)         | Alg. 2 over the compressed cache ([`turbo::decode_step`]) | INT4/INT2 blocks + INT8 buffer of 64, flushed when full |
//! | `TurboQuant` | exact attention (the fused kernel is decode-only), then the context is compressed | the fused loop over the compressed cache, the new token compressed and appended first | `TurboQuant_prod` keys, `TurboQuant_mse` values |
//!
//! Exact and Lean go through the facade [`Runtime`] on the CPU backend; Turbo and TurboQuant
//! call the core emulations directly because their caches live across steps, which the
//! stateless `Runtime::run` does not model.

use super::llama::KvAttention;
use crate::{
    turbo, Algorithm, AttentionInputs, AttentionOptions, AttentionProblem, BackendChoice,
    BackendKind, DType, Result, Runtime, Tensor,
};
use ferrattn_core::turbo::{TurboConfig, TurboKvCache};
use ferrattn_core::turboquant::{CompressedKv, TurboQuantCodec, TurboQuantConfig};

/// An attention method and its settings.
#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    /// Exact softmax attention: the reference.
    Exact,
    /// LeanAttention stream-K decode.
    Lean,
    /// TurboAttention with its compressed cache.
    Turbo(TurboConfig),
    /// TurboQuant KV compression.
    TurboQuant(TurboQuantConfig),
}

impl Method {
    /// A fresh per-sequence state for a model of `layers` layers.
    pub fn session(&self, layers: usize) -> Result<Box<dyn KvAttention>> {
        let cpu = |a| -> Result<Runtime> {
            Ok(Runtime::select(BackendChoice::Exactly(BackendKind::Cpu), a)?.runtime)
        };
        let exact = || -> Result<FullKv> {
            Ok(FullKv {
                exact: cpu(Algorithm::Exact)?,
                decode: None,
                k: vec![None; layers],
                v: vec![None; layers],
            })
        };
        Ok(match self {
            Method::Exact => Box::new(exact()?),
            Method::Lean => Box::new(FullKv {
                decode: Some(cpu(Algorithm::Lean)?),
                ..exact()?
            }),
            Method::Turbo(cfg) => {
                cfg.validate()?;
                Box::new(TurboSession {
                    cfg: cfg.clone(),
                    caches: (0..layers).map(|_| None).collect(),
                })
            }
            Method::TurboQuant(cfg) => Box::new(TurboQuantSession {
                cfg: cfg.clone(),
                codec: None,
                exact: cpu(Algorithm::Exact)?,
                caches: (0..layers).map(|_| None).collect(),
            }),
        })
    }
}

fn problem(x: &AttentionInputs, causal: bool) -> Result<AttentionProblem> {
    Ok(x.problem(
        AttentionOptions {
            causal,
            softmax_scale: None,
        },
        None,
    )?)
}

fn run(rt: &Runtime, algo: Algorithm, x: &AttentionInputs, causal: bool) -> Result<Vec<f32>> {
    let p = problem(x, causal)?;
    let plan = rt.plan(algo, &p)?;
    Ok(rt.run(&plan, x)?.o.data)
}

fn missing_prefill(layer: usize) -> crate::FerrattnError {
    super::ModelError::Unsupported(format!(
        "decode in layer {layer} before its prefill (the cache is empty)"
    ))
    .into()
}

/// Appends the rows of `new` (`[1, 1, H, D]`) to `cache` (`[1, S, H, D]`).
fn append(cache: &mut Tensor, new: &Tensor) {
    cache.data.extend_from_slice(&new.data);
    cache.shape[1] += new.shape[1];
}

/// Full-precision K and V per layer; prefill by exact attention, decode by `decode` (Lean) or
/// exact attention.
struct FullKv {
    exact: Runtime,
    decode: Option<Runtime>,
    k: Vec<Option<Tensor>>,
    v: Vec<Option<Tensor>>,
}

impl KvAttention for FullKv {
    fn prefill(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>> {
        let x = AttentionInputs::new(q, k, v);
        let o = run(&self.exact, Algorithm::Exact, &x, true)?;
        self.k[layer] = Some(x.k);
        self.v[layer] = x.v;
        Ok(o)
    }

    fn decode(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>> {
        let (Some(mut kc), Some(mut vc)) = (self.k[layer].take(), self.v[layer].take()) else {
            return Err(missing_prefill(layer));
        };
        append(&mut kc, &k);
        append(&mut vc, &v);
        // the new query sees every cached key and itself: no mask needed
        let x = AttentionInputs::new(q, kc, vc);
        let o = match &self.decode {
            Some(rt) => run(rt, Algorithm::Lean, &x, false),
            None => run(&self.exact, Algorithm::Exact, &x, false),
        };
        self.k[layer] = Some(x.k);
        self.v[layer] = x.v;
        o
    }
}

/// TurboAttention: Alg. 1 prefill, which leaves the compressed cache (full blocks of 64 at the
/// configured bits, the tail in the INT8 buffer), then Alg. 2 decode steps that append to the
/// buffer and flush it into a block every 64 tokens.
struct TurboSession {
    cfg: TurboConfig,
    caches: Vec<Option<TurboKvCache>>,
}

impl KvAttention for TurboSession {
    fn prefill(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>> {
        let x = AttentionInputs::new(q, k, v);
        let p = problem(&x, true)?;
        let (out, cache) = turbo::prefill(&self.cfg, &p, &x)?;
        self.caches[layer] = Some(cache);
        Ok(out.o.data)
    }

    fn decode(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>> {
        let cache = self.caches[layer]
            .as_mut()
            .ok_or_else(|| missing_prefill(layer))?;
        let scale = 1.0 / (q.shape[3] as f32).sqrt();
        Ok(turbo::decode_step(&self.cfg, cache, &q, &k, &v, scale)?
            .o
            .data)
    }
}

/// TurboQuant: exact prefill, the context compressed into the fused kernel's operand layout,
/// then each decode step compresses its token, appends it, and runs the fused loop.
struct TurboQuantSession {
    cfg: TurboQuantConfig,
    codec: Option<TurboQuantCodec>,
    exact: Runtime,
    caches: Vec<Option<CompressedKv>>,
}

impl KvAttention for TurboQuantSession {
    fn prefill(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>> {
        let x = AttentionInputs::new(q, k, v);
        let p = problem(&x, true)?;
        self.cfg.check(&p)?;
        let codec = self
            .codec
            .get_or_insert_with(|| TurboQuantCodec::new(&self.cfg, p.head_dim_qk, p.head_dim_v));
        self.caches[layer] = Some(codec.compress(&p, &x));
        run(&self.exact, Algorithm::Exact, &x, true)
    }

    fn decode(&mut self, layer: usize, q: Tensor, k: Tensor, v: Tensor) -> Result<Vec<f32>> {
        let (Some(kv), Some(codec)) = (self.caches[layer].as_mut(), self.codec.as_ref()) else {
            return Err(missing_prefill(layer));
        };
        let (hk, d) = (k.shape[2], k.shape[3]);
        if hk != kv.heads_kv || d != kv.head_dim_k || v.shape[3] != kv.head_dim_v {
            return Err(crate::CoreError::Shape {
                tensor: "k",
                actual: k.shape.clone(),
                expected: format!("[1, 1, {}, {}] as the cache", kv.heads_kv, kv.head_dim_k),
            }
            .into());
        }
        // rows are (token, KV head) in that order, so a token's heads go on the end
        let f16 = |x: f32| DType::F16.round(x);
        for h in 0..hk {
            let kc = codec.key.quantize(&k.data[h * d..(h + 1) * d]);
            let vc = codec.value.quantize(&v.data[h * d..(h + 1) * d]);
            kv.k_idx.extend_from_slice(&kc.idx);
            kv.k_norm.push(f16(kc.norm));
            kv.k_signs.extend_from_slice(&kc.signs);
            kv.r_norm.push(f16(kc.r_norm));
            kv.v_idx.extend_from_slice(&vc.idx);
            kv.v_norm.push(f16(vc.norm));
        }
        kv.max_seqlen_k += 1;
        kv.seqlens_k[0] += 1;
        let n = kv.max_seqlen_k;
        let p = AttentionProblem::uniform(1, 1, n, q.shape[2], hk, d, d, DType::F32);
        self.cfg.check(&p)?;
        Ok(codec.attend(&self.cfg, &p, &q, kv).o.data)
    }
}
