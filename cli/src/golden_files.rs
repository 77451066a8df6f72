//! Checked-in golden files shared by every backend's tests (`tests/golden/*.safetensors`).
//!
//! Each file holds the inputs of one case (`q`, `k`, `v` or MLA `kv`, optional `seqlens_k`), the
//! exact f64 reference rounded to f32 (`o_ref`, `lse_ref`), and metadata: `causal`,
//! `softmax_scale`, `head_dim_v`, and `algorithms`, the comma-separated algorithms whose
//! support covers the case. Regenerate with `ferrattn golden --out tests/golden`; generation is
//! deterministic (fixed seeds), and a test checks the checked-in files equal a fresh generation.

use crate::io::{read_file, write_file};
use crate::{FerrattnError, Result};
use ferrattn_core::golden::exact_attention_f64;
use ferrattn_core::{
    Algorithm, AttentionInputs, AttentionOptions, AttentionProblem, DType, Tensor,
};
use rand::SeedableRng;
use std::collections::HashMap;
use std::path::Path;

/// The definition of one golden case.
#[derive(Clone, Debug)]
pub struct CaseSpec {
    /// File stem.
    pub name: &'static str,
    /// `[B, Sq, Sk, Hq, Hk, D, Dv]`.
    pub dims: [usize; 7],
    /// Per-sequence KV lengths (`None`: all `Sk`).
    pub seqlens_k: Option<&'static [i64]>,
    /// Element type.
    pub dtype: DType,
    /// Causal mask.
    pub causal: bool,
    /// MLA latent layout (k is `kv`, V its first Dv columns).
    pub mla: bool,
    /// Algorithms whose support covers this case.
    pub algorithms: &'static [Algorithm],
    /// RNG seed of the inputs.
    pub seed: u64,
}

/// Every golden case. Lengths miss tile boundaries on purpose (37, 63, 65, 577, 600).
pub const CASES: &[CaseSpec] = &[
    CaseSpec {
        name: "mha_f32_prefill_causal",
        dims: [2, 37, 37, 4, 4, 64, 64],
        seqlens_k: None,
        dtype: DType::F32,
        causal: true,
        mla: false,
        algorithms: &[Algorithm::Exact, Algorithm::Turbo],
        seed: 1,
    },
    CaseSpec {
        name: "gqa_f16_decode_ragged",
        dims: [3, 1, 577, 8, 2, 64, 64],
        seqlens_k: Some(&[577, 1, 300]),
        dtype: DType::F16,
        causal: false,
        mla: false,
        algorithms: &[
            Algorithm::Exact,
            Algorithm::Lean,
            Algorithm::Turbo,
            Algorithm::TurboQuant,
        ],
        seed: 2,
    },
    CaseSpec {
        name: "gqa_bf16_decode_sq4_causal",
        dims: [2, 4, 129, 8, 1, 128, 128],
        seqlens_k: Some(&[129, 65]),
        dtype: DType::BF16,
        causal: true,
        mla: false,
        algorithms: &[
            Algorithm::Exact,
            Algorithm::Lean,
            Algorithm::Turbo,
            Algorithm::TurboQuant,
        ],
        seed: 3,
    },
    CaseSpec {
        name: "f16_causal_sq_gt_sk",
        dims: [1, 65, 63, 2, 2, 64, 64],
        seqlens_k: None,
        dtype: DType::F16,
        causal: true,
        mla: false,
        algorithms: &[Algorithm::Exact, Algorithm::Turbo],
        seed: 4,
    },
    CaseSpec {
        name: "mla_bf16_decode_ragged",
        dims: [2, 2, 600, 16, 1, 576, 512],
        seqlens_k: Some(&[600, 37]),
        dtype: DType::BF16,
        causal: false,
        mla: true,
        algorithms: &[Algorithm::Exact, Algorithm::Amla],
        seed: 5,
    },
];

/// A loaded golden case.
#[derive(Clone, Debug)]
pub struct GoldenCase {
    /// File stem.
    pub name: String,
    /// Inputs.
    pub inputs: AttentionInputs,
    /// The validated problem.
    pub problem: AttentionProblem,
    /// Exact O, rounded to f32.
    pub o_ref: Tensor,
    /// Exact LSE.
    pub lse_ref: Tensor,
    /// Algorithms that cover this case.
    pub algorithms: Vec<Algorithm>,
}

/// Builds the inputs of a case from its seed.
pub fn case_inputs(spec: &CaseSpec) -> AttentionInputs {
    let [b, sq, sk, hq, hk, d, dv] = spec.dims;
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let q = Tensor::randn(&[b, sq, hq, d], spec.dtype, 1.0, &mut rng);
    let k = Tensor::randn(&[b, sk, hk, d], spec.dtype, 1.0, &mut rng);
    let mut x = if spec.mla {
        AttentionInputs::mla(q, k)
    } else {
        let v = Tensor::randn(&[b, sk, hk, dv], spec.dtype, 1.0, &mut rng);
        AttentionInputs::new(q, k, v)
    };
    x.seqlens_k = spec.seqlens_k.map(|s| s.to_vec());
    x
}

/// Writes every case into `dir`; returns the paths written.
pub fn generate(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| FerrattnError::File {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    let mut written = vec![];
    for spec in CASES {
        let x = case_inputs(spec);
        let opts = AttentionOptions {
            causal: spec.causal,
            softmax_scale: None,
        };
        let p = x.problem(opts, Some(spec.dims[6]))?;
        let (o, lse) = exact_attention_f64(&p, &x);
        let o_ref = Tensor {
            shape: vec![p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v],
            dtype: DType::F32,
            data: o.iter().map(|&v| v as f32).collect(),
        };
        let lse_ref = Tensor {
            shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
            dtype: DType::F32,
            data: lse.iter().map(|&v| v as f32).collect(),
        };
        let mut meta = HashMap::new();
        meta.insert("causal".to_string(), spec.causal.to_string());
        meta.insert("softmax_scale".to_string(), p.softmax_scale.to_string());
        meta.insert("head_dim_v".to_string(), p.head_dim_v.to_string());
        meta.insert(
            "algorithms".to_string(),
            spec.algorithms
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(","),
        );
        meta.insert(
            "generator".to_string(),
            "ferrattn golden --out tests/golden".to_string(),
        );
        let kname = if spec.mla { "kv" } else { "k" };
        let mut tensors: Vec<(&str, &Tensor)> = vec![("q", &x.q), (kname, &x.k)];
        if let Some(v) = &x.v {
            tensors.push(("v", v));
        }
        tensors.push(("o_ref", &o_ref));
        tensors.push(("lse_ref", &lse_ref));
        let ints: Vec<(&str, &[i64])> = x
            .seqlens_k
            .as_deref()
            .map(|s| vec![("seqlens_k", s)])
            .unwrap_or_default();
        let path = dir.join(format!("{}.safetensors", spec.name));
        write_file(&path, &tensors, &ints, meta)?;
        written.push(path);
    }
    Ok(written)
}

/// Loads one golden file.
pub fn load(path: &Path) -> Result<GoldenCase> {
    let mut f = read_file(path)?;
    let bad = |m: String| FerrattnError::File {
        path: path.display().to_string(),
        message: m,
    };
    let meta = |k: &str| {
        f.metadata
            .get(k)
            .cloned()
            .ok_or_else(|| bad(format!("metadata has no {k}")))
    };
    let causal = meta("causal")? == "true";
    let scale: f32 = meta("softmax_scale")?
        .parse()
        .map_err(|e| bad(format!("softmax_scale: {e}")))?;
    let dv: usize = meta("head_dim_v")?
        .parse()
        .map_err(|e| bad(format!("head_dim_v: {e}")))?;
    let algorithms = meta("algorithms")?
        .split(',')
        .map(|s| Algorithm::parse(s).ok_or_else(|| bad(format!("unknown algorithm {s}"))))
        .collect::<Result<Vec<_>>>()?;
    let mut take = |n: &str| {
        f.tensors
            .remove(n)
            .ok_or_else(|| bad(format!("no tensor {n}")))
    };
    let q = take("q")?;
    let o_ref = take("o_ref")?;
    let lse_ref = take("lse_ref")?;
    let inputs = match (
        f.tensors.remove("k"),
        f.tensors.remove("v"),
        f.tensors.remove("kv"),
    ) {
        (Some(k), Some(v), None) => AttentionInputs::new(q, k, v),
        (None, None, Some(kv)) => AttentionInputs::mla(q, kv),
        _ => return Err(bad("expected k and v, or kv".into())),
    };
    let inputs = AttentionInputs {
        seqlens_k: f.ints.remove("seqlens_k"),
        ..inputs
    };
    let problem = inputs.problem(
        AttentionOptions {
            causal,
            softmax_scale: Some(scale),
        },
        Some(dv),
    )?;
    let name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(GoldenCase {
        name,
        inputs,
        problem,
        o_ref,
        lse_ref,
        algorithms,
    })
}

/// Loads every `*.safetensors` in `dir`, sorted by name.
pub fn load_dir(dir: &Path) -> Result<Vec<GoldenCase>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| FerrattnError::File {
            path: dir.display().to_string(),
            message: e.to_string(),
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    paths.sort();
    paths.iter().map(|p| load(p)).collect()
}
