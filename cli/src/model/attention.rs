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
use crate::error::Result;
use crate::{
    turbo, Algorithm, AttentionInputs, AttentionOptions, AttentionProblem, BackendChoice,
    BackendKind, DType, Runtime, Tensor,
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

fn missing_prefill(layer: usize) -> crate::error::CliError {
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
        let sign_bytes = codec.key.qjl().sign_bytes();
        for h in 0..hk {
            let kr = &k.data[h * d..(h + 1) * d];
            let vc = codec.value.quantize(&v.data[h * d..(h + 1) * d]);
            if codec.key_qjl {
                let kc = codec.key.quantize(kr);
                kv.k_idx.extend_from_slice(&kc.idx);
                kv.k_norm.push(f16(kc.norm));
                kv.k_signs.extend_from_slice(&kc.signs);
                kv.r_norm.push(f16(kc.r_norm));
            } else {
                // MSE-only keys: the cache holds zero signs and a zero residual norm, as
                // `TurboQuantCodec::compress` stores them
                let kc = codec.key.mse().quantize(kr);
                kv.k_idx.extend_from_slice(&kc.idx);
                kv.k_norm.push(f16(kc.norm));
                kv.k_signs.extend(std::iter::repeat_n(0, sign_bytes));
                kv.r_norm.push(0.0);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn randn(shape: &[usize], rng: &mut rand::rngs::StdRng) -> Tensor {
        Tensor::randn(shape, DType::F32, 1.0, rng)
    }

    /// Rows `from..to` of a `[1, S, H, D]` tensor.
    fn rows(t: &Tensor, from: usize, to: usize) -> Tensor {
        let w = t.shape[2] * t.shape[3];
        Tensor {
            shape: vec![1, to - from, t.shape[2], t.shape[3]],
            dtype: t.dtype,
            data: t.data[from * w..to * w].to_vec(),
        }
    }

    /// Runs `method` as the model does: prefill of the first `ctx` tokens, then one decode
    /// step per remaining token; returns each decode step's O.
    fn decode_outputs(
        method: &Method,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        ctx: usize,
    ) -> Vec<Vec<f32>> {
        let mut s = method.session(1).unwrap();
        s.prefill(0, rows(q, 0, ctx), rows(k, 0, ctx), rows(v, 0, ctx))
            .unwrap();
        (ctx..q.shape[1])
            .map(|t| {
                s.decode(0, rows(q, t, t + 1), rows(k, t, t + 1), rows(v, t, t + 1))
                    .unwrap()
            })
            .collect()
    }

    /// The decode steps with their caches agree with each algorithm run in one call over the
    /// whole context (the core's own decode semantics): the incremental caches hold what a
    /// one-shot compression of the same tokens holds.
    #[test]
    fn incremental_caches_match_one_shot_runs() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let (n, ctx, hq, hk, d) = (70, 60, 9, 3, 64);
        let (q, k, v) = (
            randn(&[1, n, hq, d], &mut rng),
            randn(&[1, n, hk, d], &mut rng),
            randn(&[1, n, hk, d], &mut rng),
        );
        let tq = TurboQuantConfig {
            block_k: 64,
            key_bits: 3,
            value_bits: 2,
            qjl_dim: 64,
            seed: 5,
            defer_value_unrotation: false,
            key_qjl: true,
        };
        let turbo_cfg = TurboConfig {
            kv_bits: ferrattn_core::turbo::KvBits::PerHead {
                bits: vec![4, 2, 4],
            },
            ..TurboConfig::default()
        };
        for method in [
            Method::Exact,
            Method::Lean,
            Method::Turbo(turbo_cfg.clone()),
            Method::TurboQuant(tq.clone()),
            Method::TurboQuant(TurboQuantConfig {
                key_qjl: false,
                ..tq.clone()
            }),
        ] {
            let got = decode_outputs(&method, &q, &k, &v, ctx);
            for (step, o) in got.iter().enumerate() {
                let t = ctx + step;
                // the query of step t over keys 0..=t in one call
                let x = AttentionInputs::new(
                    rows(&q, t, t + 1),
                    rows(&k, 0, t + 1),
                    rows(&v, 0, t + 1),
                );
                let p = problem(&x, false).unwrap();
                let want = match &method {
                    Method::Exact | Method::Lean => {
                        ferrattn_core::golden::exact_attention(&p, &x).o.data
                    }
                    Method::Turbo(cfg) => {
                        // context compressed as a prefill leaves it, then the decode tokens appended
                        let mut cache = TurboKvCache::from_context(
                            cfg,
                            &rows(&k, 0, ctx),
                            &rows(&v, 0, ctx),
                            &[ctx],
                        )
                        .unwrap();
                        for j in ctx..=t {
                            cache
                                .append(&rows(&k, j, j + 1), &rows(&v, j, j + 1))
                                .unwrap();
                        }
                        turbo::decode(cfg, &cache, &rows(&q, t, t + 1), p.softmax_scale)
                            .unwrap()
                            .o
                            .data
                    }
                    Method::TurboQuant(cfg) => {
                        let codec = TurboQuantCodec::new(cfg, d, d);
                        let kv = codec.compress(&p, &x);
                        codec.attend(cfg, &p, &x.q, &kv).o.data
                    }
                };
                let err = o
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                let tol = match method {
                    Method::Exact | Method::Lean => 1e-5,
                    _ => 0.0,
                };
                assert!(err <= tol, "{method:?} step {t}: max error {err}");
            }
        }
    }
}
