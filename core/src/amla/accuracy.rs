//! Reproduction of AMLA's accuracy study (section 5.1, Tables 3 and 4).
//!
//! What the paper specifies, and what this module does with it:
//!
//! * **Inputs**: Q, K, V in BF16 drawn from a Gaussian `N(0, sigma^2)` (Table 3; the column
//!   headers give the *variance*: N(0,1), N(0,4), N(0,9), N(0,16), N(0,25), N(0,100), i.e.
//!   `sigma` = 1, 2, 3, 4, 5, 10) or a uniform `U(a, b)` (Table 4: U(-1,1), U(-3,3), U(-5,5),
//!   U(-10,10), U(-20,20), U(-60,60)). Values are drawn in FP32 and rounded to BF16; the same
//!   BF16 values feed Golden, Base and AMLA. The MLA latent layout is used: one `kv` tensor
//!   `[B, Sk, 1, 576]` whose first 512 columns are V, as the AMLA kernel reads it.
//! * **Shape**: "typical settings (context length = 8K)": `Sk = 8192`; the paper's typical MLA
//!   decode elsewhere is 128 query heads, 1 latent KV head, `Dk = 576`, `Dv = 512` (sections 3.1,
//!   5.2), which [`AccuracySetup::paper`] uses with batch 1 and one query token. The batch and
//!   query length of the accuracy runs are not stated.
//! * **Golden**: "High-precision FP32 attention computation implemented on CPU": here exact
//!   attention in `f64` ([`golden_f64`], the same computation as
//!   [`crate::golden::exact_attention_f64`] with a cache-friendlier loop order, several times
//!   faster on an 8K context) on the same BF16 inputs, *not* rounded to BF16 (an FP32 golden
//!   differs from it by ~1e-7, far below the errors measured).
//! * **Base**: "CPU simulation of the standard FlashAttention implementation using
//!   mixed-precision matrix multiplications, with final outputs in FP16 or BF16":
//!   [`super::emulate_base`], BF16 output.
//! * **AMLA**: "NPU implementation based on Algorithm 2": [`super::emulate()`] with compensation,
//!   BF16 output.
//! * **Metric**: `E(A, B) = ||A - B||_F / (||B||_F + 1e-10)` between a method's output A and
//!   Golden B, over the whole output tensor of one sample; averaged over the samples (100 in
//!   the paper).
//!
//! The readings "output in BF16" and "Golden not rounded" are the ones the numbers select: with
//! them the eight columns whose error does not hinge on near-tie rows land within 1% of the
//! published Base and AMLA values. An FP16 or FP32 output against the same Golden misses by
//! 50-60%; a BF16 output against a BF16-rounded Golden by 7-64% (5% above at U(-1,1)); an FP16
//! output against a BF16-rounded Golden comes within 0-3% too (the Golden's rounding then plays
//! the part of the output's), but the paper calls its Golden high-precision FP32 and its outputs
//! BF16. The test `explore_metric_definitions` prints all five readings. The errors are
//! dominated by the final BF16 rounding of O (~1.5e-3 relative on a diffuse softmax); the BF16
//! cast of P adds the rest, and one-hot rows (large inputs) contribute nothing.
//!
//! Measured with [`reproduce`] (100 samples, seed 42), as ratios to the paper's AMLA value:
//! N(0,1..25) and U(-1..-10, 1..10) within 0.998-1.015; N(0,100) 0.976, U(-20,20) 0.992,
//! U(-60,60) 0.961; AMLA/Base 1.021 at N(0,1) and 1.016 at U(-1,1) (paper: 1.023 and 1.020),
//! <= 1.011 elsewhere. The last three columns depend on how many rows one sample holds (the
//! per-sample metric is a square root of a sum dominated by a few near-tie rows, so its mean
//! grows with the rows per sample): at 128 rows U(-60,60) tends to 2.16e-4, at >= 1024 rows
//! (batch >= 8) to 2.26e-4, the paper's value; the paper does not state its batch.

use super::{emulate::run_f32_multi, AmlaPlan, Compensation, Rescaling};
use crate::{AttentionInputs, AttentionProblem, DType, KvLayout, Result, Tensor};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// `epsilon` of the paper's relative Frobenius error (section 5.1).
pub const METRIC_EPSILON: f64 = 1e-10;

/// An input distribution of Tables 3 and 4.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum InputDistribution {
    /// `N(0, variance)`: the table headers give the variance (N(0,100) has sigma = 10).
    Gaussian {
        /// `sigma^2`.
        variance: f32,
    },
    /// `U(lo, hi)`.
    Uniform {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
}

impl InputDistribution {
    /// The paper's column header, e.g. `N(0,4)` or `U(-3,3)`.
    pub fn label(&self) -> String {
        match *self {
            InputDistribution::Gaussian { variance } => format!("N(0,{variance})"),
            InputDistribution::Uniform { lo, hi } => format!("U({lo},{hi})"),
        }
    }

    /// Draws a BF16 tensor of `shape`.
    pub fn sample(&self, shape: &[usize], rng: &mut StdRng) -> Tensor {
        match *self {
            InputDistribution::Gaussian { variance } => {
                Tensor::randn(shape, DType::BF16, variance.sqrt(), rng)
            }
            InputDistribution::Uniform { lo, hi } => {
                Tensor::uniform(shape, DType::BF16, lo, hi, rng)
            }
        }
    }
}

/// Which accuracy table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccuracyTable {
    /// Table 3: Gaussian inputs.
    Table3,
    /// Table 4: uniform inputs.
    Table4,
}

impl AccuracyTable {
    /// Both tables.
    pub const ALL: [AccuracyTable; 2] = [AccuracyTable::Table3, AccuracyTable::Table4];

    /// The published columns of this table.
    pub fn published(self) -> &'static [PublishedValue; 6] {
        match self {
            AccuracyTable::Table3 => &TABLE_3,
            AccuracyTable::Table4 => &TABLE_4,
        }
    }

    /// `"Table 3"` or `"Table 4"`.
    pub fn name(self) -> &'static str {
        match self {
            AccuracyTable::Table3 => "Table 3",
            AccuracyTable::Table4 => "Table 4",
        }
    }
}

/// One published column: `E(., Golden)` of Base and of AMLA for one input distribution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PublishedValue {
    /// The input distribution of Q, K, V.
    pub distribution: InputDistribution,
    /// The paper's Base error.
    pub base: f64,
    /// The paper's AMLA error.
    pub amla: f64,
}

const fn gauss(variance: f32, base: f64, amla: f64) -> PublishedValue {
    PublishedValue {
        distribution: InputDistribution::Gaussian { variance },
        base,
        amla,
    }
}

const fn unif(b: f32, base: f64, amla: f64) -> PublishedValue {
    PublishedValue {
        distribution: InputDistribution::Uniform { lo: -b, hi: b },
        base,
        amla,
    }
}

/// AMLA paper, Table 3 ("Accuracy comparison under Gaussian input distributions"):
/// `E(., Golden)` of Base and AMLA, mean over 100 samples, context length 8K.
pub const TABLE_3: [PublishedValue; 6] = [
    gauss(1.0, 1.77e-3, 1.81e-3),
    gauss(4.0, 1.74e-3, 1.75e-3),
    gauss(9.0, 1.65e-3, 1.66e-3),
    gauss(16.0, 1.51e-3, 1.51e-3),
    gauss(25.0, 1.33e-3, 1.35e-3),
    gauss(100.0, 7.82e-4, 7.86e-4),
];

/// AMLA paper, Table 4 ("Accuracy comparison under uniform input distributions"):
/// `E(., Golden)` of Base and AMLA, mean over 100 samples, context length 8K.
pub const TABLE_4: [PublishedValue; 6] = [
    unif(1.0, 1.97e-3, 2.01e-3),
    unif(3.0, 1.77e-3, 1.78e-3),
    unif(5.0, 1.69e-3, 1.69e-3),
    unif(10.0, 1.24e-3, 1.24e-3),
    unif(20.0, 7.04e-4, 7.04e-4),
    unif(60.0, 2.26e-4, 2.26e-4),
];

/// The shape of one accuracy sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccuracySetup {
    /// Sequences per sample.
    pub batch: usize,
    /// Query heads (one latent KV head).
    pub heads: usize,
    /// Query tokens per sequence.
    pub seq_q: usize,
    /// Context length (KV tokens).
    pub seq_k: usize,
    /// Q/K head dimension (576 for MLA).
    pub head_dim_qk: usize,
    /// V/O head dimension (512 for MLA).
    pub head_dim_v: usize,
    /// KV block of both AMLA and Base (512 in the paper).
    pub block_k: usize,
}

impl AccuracySetup {
    /// The paper's setting: context 8K, 128 query heads, 1 latent KV head, Dk = 576, Dv = 512,
    /// KV block 512; batch 1 and one query token (not stated in section 5.1).
    pub fn paper() -> AccuracySetup {
        AccuracySetup {
            batch: 1,
            heads: 128,
            seq_q: 1,
            seq_k: 8192,
            head_dim_qk: 576,
            head_dim_v: 512,
            block_k: super::AMLA_BLOCK_K,
        }
    }

    /// The MLA problem of one sample.
    pub fn problem(&self) -> AttentionProblem {
        let mut p = AttentionProblem::uniform(
            self.batch,
            self.seq_q,
            self.seq_k,
            self.heads,
            1,
            self.head_dim_qk,
            self.head_dim_v,
            DType::BF16,
        );
        p.kv_layout = KvLayout::MlaLatent;
        p
    }
}

/// One reproduced column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccuracyRow {
    /// The table it belongs to.
    pub table: AccuracyTable,
    /// The input distribution.
    pub distribution: InputDistribution,
    /// The paper's column header.
    pub label: String,
    /// The shape of each sample.
    pub setup: AccuracySetup,
    /// Samples averaged.
    pub samples: usize,
    /// Published Base error.
    pub paper_base: f64,
    /// Published AMLA error.
    pub paper_amla: f64,
    /// Our Base error (mean over samples).
    pub base: f64,
    /// Our AMLA error (mean over samples).
    pub amla: f64,
    /// Our AMLA error without the Appendix A compensation (mean over samples).
    pub amla_uncompensated: f64,
    /// `amla / base`.
    pub amla_over_base: f64,
    /// `amla / paper_amla`.
    pub amla_over_paper: f64,
}

/// The paper's metric `||A - B||_F / (||B||_F + 1e-10)`, with B the reference (Golden).
pub fn relative_frobenius(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "relative_frobenius needs equal lengths");
    let (mut d2, mut b2) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let d = x as f64 - y;
        d2 += d * d;
        b2 += y * y;
    }
    d2.sqrt() / (b2.sqrt() + METRIC_EPSILON)
}

/// `f64` dot product with 8 partial sums (vectorisable; error ~1e-16 relative).
fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        let (x, y): (&[f32; 8], &[f32; 8]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for ((a, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *a += x as f64 * y as f64;
        }
    }
    let tail: f64 = ra.iter().zip(rb).map(|(&x, &y)| x as f64 * y as f64).sum();
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Golden O `[B, Sq, Hq, Dv]` in `f64` for an MLA problem: exact softmax attention of the
/// inputs as given (no cast), as [`crate::golden::exact_attention_f64`] computes it (rows with
/// no key are 0), with a cache-friendlier loop order (groups of heads share each KV block) and
/// a vectorisable summation order.
pub fn golden_f64(p: &AttentionProblem, x: &AttentionInputs) -> Vec<f64> {
    const HEADS: usize = 8;
    const KEYS: usize = 256;
    let (sq, sk, hq, dqk, dv) = (
        p.max_seqlen_q,
        p.max_seqlen_k,
        p.heads_q,
        p.head_dim_qk,
        p.head_dim_v,
    );
    let scale = p.softmax_scale as f64;
    let chunks = hq.div_ceil(HEADS);
    let per_task: Vec<Vec<(usize, Vec<f64>)>> = (0..p.batch * chunks)
        .into_par_iter()
        .map(|task| {
            let (b, h0) = (task / chunks, (task % chunks) * HEADS);
            let kv = &x.k.data[b * sk * dqk..(b + 1) * sk * dqk];
            // (flat row index, visible keys, weights) of every row of the group that sees a key
            let mut rows: Vec<(usize, usize, Vec<f64>)> = Vec::new();
            for h in h0..(h0 + HEADS).min(hq) {
                for i in 0..p.seqlens_q[b] {
                    let end = p.visible_keys(b, i);
                    if end > 0 {
                        rows.push(((b * sq + i) * hq + h, end, vec![0.0; end]));
                    }
                }
            }
            let max_end = rows.iter().map(|r| r.1).max().unwrap_or(0);
            for k0 in (0..max_end).step_by(KEYS) {
                for (r, end, w) in rows.iter_mut() {
                    let q = &x.q.data[*r * dqk..(*r + 1) * dqk];
                    for j in k0..(k0 + KEYS).min(*end) {
                        w[j] = dot_f64(q, &kv[j * dqk..(j + 1) * dqk]) * scale;
                    }
                }
            }
            let mut out: Vec<(usize, Vec<f64>, f64)> = rows
                .iter_mut()
                .map(|(r, _, w)| {
                    let m = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let mut l = 0.0;
                    for wj in w.iter_mut() {
                        *wj = (*wj - m).exp();
                        l += *wj;
                    }
                    (*r, vec![0.0f64; dv], l)
                })
                .collect();
            for k0 in (0..max_end).step_by(KEYS) {
                for ((_, end, w), (_, o, _)) in rows.iter().zip(out.iter_mut()) {
                    for j in k0..(k0 + KEYS).min(*end) {
                        if w[j] == 0.0 {
                            continue; // an underflowed weight adds exactly nothing
                        }
                        for (a, &v) in o.iter_mut().zip(&kv[j * dqk..j * dqk + dv]) {
                            *a += w[j] * v as f64;
                        }
                    }
                }
            }
            out.drain(..)
                .map(|(r, mut o, l)| {
                    o.iter_mut().for_each(|a| *a /= l);
                    (r, o)
                })
                .collect()
        })
        .collect();
    let mut o = vec![0.0f64; p.batch * sq * hq * dv];
    for (r, orow) in per_task.into_iter().flatten() {
        o[r * dv..(r + 1) * dv].copy_from_slice(&orow);
    }
    o
}

/// Errors of one sample against Golden.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SampleErrors {
    /// AMLA (compensated), BF16 output.
    pub amla: f64,
    /// AMLA without compensation, BF16 output.
    pub amla_uncompensated: f64,
    /// Base, BF16 output.
    pub base: f64,
}

/// Draws one sample (`q` then `kv`, from `rng`) for `setup`.
pub fn sample_inputs(
    dist: &InputDistribution,
    setup: &AccuracySetup,
    rng: &mut StdRng,
) -> AttentionInputs {
    let q = dist.sample(
        &[setup.batch, setup.seq_q, setup.heads, setup.head_dim_qk],
        rng,
    );
    let kv = dist.sample(&[setup.batch, setup.seq_k, 1, setup.head_dim_qk], rng);
    AttentionInputs::mla(q, kv)
}

/// The errors of one sample against Golden.
pub fn sample_errors(
    dist: &InputDistribution,
    setup: &AccuracySetup,
    rng: &mut StdRng,
) -> Result<SampleErrors> {
    let p = setup.problem();
    let x = sample_inputs(dist, setup, rng);
    let golden = golden_f64(&p, &x);
    let outs = run_f32_multi(
        &p,
        &x,
        setup.block_k,
        &[
            Rescaling::Amla(Compensation::AppendixA),
            Rescaling::Amla(Compensation::Off),
            Rescaling::Base,
        ],
    )?;
    let err = |o: &[f32]| -> f64 {
        let o: Vec<f32> = o.iter().map(|&v| DType::BF16.round(v)).collect(); // BF16 output
        relative_frobenius(&o, &golden)
    };
    Ok(SampleErrors {
        amla: err(&outs[0].0),
        amla_uncompensated: err(&outs[1].0),
        base: err(&outs[2].0),
    })
}

/// Seed of sample `s` of column `col` of `table`, derived from the user's seed (SplitMix64).
fn sample_seed(seed: u64, table: AccuracyTable, col: usize, s: usize) -> u64 {
    let mut z = seed
        ^ ((table as u64 + 1) << 56)
        ^ ((col as u64 + 1) << 40)
        ^ (s as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Reproduces one table with the paper's setup ([`AccuracySetup::paper`]): `samples` samples per
/// column (the paper uses 100). `progress` is called after every sample with the number of
/// samples done so far in this table (`6 * samples` in all).
pub fn reproduce(
    table: AccuracyTable,
    samples: usize,
    seed: u64,
    progress: &dyn Fn(usize),
) -> Vec<AccuracyRow> {
    reproduce_with(table, &AccuracySetup::paper(), samples, seed, progress)
        .expect("the paper's accuracy setup is a valid AMLA problem")
}

/// [`reproduce`] with another sample shape (fewer heads or a shorter context for quick tests).
pub fn reproduce_with(
    table: AccuracyTable,
    setup: &AccuracySetup,
    samples: usize,
    seed: u64,
    progress: &dyn Fn(usize),
) -> Result<Vec<AccuracyRow>> {
    let mut rows = Vec::new();
    for col in 0..table.published().len() {
        let done = col * samples;
        rows.push(reproduce_column(table, col, setup, samples, seed, &|s| {
            progress(done + s)
        })?);
    }
    Ok(rows)
}

/// One column (`col` in `0..6`, in the paper's order) of `table`: `samples` samples of `setup`
/// drawn from that column's distribution. `progress` gets the samples done so far.
pub fn reproduce_column(
    table: AccuracyTable,
    col: usize,
    setup: &AccuracySetup,
    samples: usize,
    seed: u64,
    progress: &dyn Fn(usize),
) -> Result<AccuracyRow> {
    let caps = crate::DeviceCaps::cpu(rayon::current_num_threads());
    let _: AmlaPlan = super::plan(&setup.problem(), &caps)?; // the setup must be an AMLA problem
    let published = table
        .published()
        .get(col)
        .ok_or_else(|| crate::CoreError::BadLength {
            what: format!("{} column", table.name()),
            value: col as i64,
            requirement: format!("below {}", table.published().len()),
        })?;
    let (mut amla, mut amla_unc, mut base) = (0.0, 0.0, 0.0);
    for s in 0..samples {
        let mut rng = StdRng::seed_from_u64(sample_seed(seed, table, col, s));
        let e = sample_errors(&published.distribution, setup, &mut rng)?;
        amla += e.amla;
        amla_unc += e.amla_uncompensated;
        base += e.base;
        progress(s + 1);
    }
    let n = samples.max(1) as f64;
    let (amla, amla_unc, base) = (amla / n, amla_unc / n, base / n);
    Ok(AccuracyRow {
        table,
        distribution: published.distribution,
        label: published.distribution.label(),
        setup: *setup,
        samples,
        paper_base: published.base,
        paper_amla: published.amla,
        base,
        amla,
        amla_uncompensated: amla_unc,
        amla_over_base: amla / base,
        amla_over_paper: amla / published.amla,
    })
}
