//! Reproduction of TurboQuant's distortion figures (arXiv 2504.19874, Theorems 1 and 2).
//!
//! For each bit width `b = 1..=4`, over `samples` random unit vectors `x` of `R^d`:
//!
//! * **MSE**: `E ‖x - x̂‖²` of `TurboQuant_mse` at `b` bits, beside the paper's printed values
//!   (0.36, 0.117, 0.03, 0.009), the exact value of the computed Lloyd-Max codebook
//!   (`d · E[(t - c(t))²]` under the Beta law) and Theorem 1's bound `√3 π/2 · 4^-b`.
//! * **Inner-product distortion** of `TurboQuant_prod` at `b` bits (`m = d` sketch rows, as in the
//!   paper), for an independent unit `y`: `d · E(<y, x> - est)²`, so it reads against the paper's
//!   `1.57/d, 0.56/d, 0.18/d, 0.047/d` as 1.57, 0.56, 0.18, 0.047. The prediction is
//!   `(d/m) (π/2 - 1/d) D_mse(b - 1)`: QJL's variance `(π/2 ‖y‖² ‖r‖² - <y, r>²)/m`, with
//!   `E‖r‖² = D_mse(b-1)` and `E<y, r>² = E‖r‖²/d` for an independent `y` (`D_mse(0) = 1`). Theorem
//!   2's bound is `√3 π² · 4^-b` on the same scale.
//! * **Bias** on correlated pairs `y = (x + w)/‖x + w‖` (`w` an independent unit vector,
//!   `<x, y> ≈ 0.71`): the mean of `est - <y, x>` with its standard error, for `TurboQuant_prod`
//!   (should be 0) and for `TurboQuant_mse` at the same `b` (shrinks by `1 - D_mse(b)`, so its
//!   bias is about `-D_mse(b) <x, y>`). On independent pairs both would average to 0 by symmetry,
//!   which is why the bias is measured where `<x, y>` is large.
//!
//! The quantizers (rotation and sketch) are redrawn every [`QUANTIZER_REFRESH`] samples, so
//! averages run over the quantizer's randomness as the theorems state. Every sample and quantizer
//! is a pure function of `(seed, index)`, so the table does not depend on the thread count.

use super::codebook::codebook;
use super::quant::{MseQuantizer, ProdQuantizer};
use super::rng::{derive_seed, SeededRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// The paper's `D_mse` at 1, 2, 3, 4 bits (Theorem 1, printed rounded).
pub const PUBLISHED_MSE: [f64; 4] = [0.36, 0.117, 0.03, 0.009];
/// The paper's `d · D_prod` at 1, 2, 3, 4 bits (Theorem 2: `1.57/d, 0.56/d, 0.18/d, 0.047/d`).
pub const PUBLISHED_IP: [f64; 4] = [1.57, 0.56, 0.18, 0.047];
/// Samples per draw of the quantizers.
pub const QUANTIZER_REFRESH: usize = 64;

const TAG_SAMPLE: u64 = 0x5341_4d50_4c45; // "SAMPLE"
const TAG_QUANTIZER: u64 = 0x0051_5541_4e54; // "QUANT"
/// Quantizer groups handed to the thread pool between two progress reports.
const GROUPS_PER_REPORT: usize = 8;

/// One bit width of the distortion table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DistortionRow {
    /// Bits per coordinate `b`.
    pub bits: u8,
    /// Dimension `d`.
    pub d: usize,
    /// Random unit vectors measured.
    pub samples: usize,
    /// Measured `E ‖x - x̂‖²` of `TurboQuant_mse` at `b` bits.
    pub mse: f64,
    /// Standard error of `mse`.
    pub mse_stderr: f64,
    /// The same from the computed codebook and the exact coordinate law.
    pub mse_theory: f64,
    /// The paper's printed value.
    pub mse_published: f64,
    /// Theorem 1's upper bound `√3 π / 2 · 4^-b`.
    pub mse_bound: f64,
    /// Measured `d · E(<y, x> - est)²` of `TurboQuant_prod` at `b` bits, independent unit `y`.
    pub ip_distortion: f64,
    /// Standard error of `ip_distortion`.
    pub ip_distortion_stderr: f64,
    /// Prediction `(π/2 - 1/d) · D_mse(b - 1)` (with `m = d`).
    pub ip_distortion_theory: f64,
    /// The paper's printed `d · D_prod`.
    pub ip_distortion_published: f64,
    /// Theorem 2's bound `√3 π² · 4^-b` (times `d`, for unit `y`).
    pub ip_distortion_bound: f64,
    /// Mean of `est - <y, x>` of `TurboQuant_prod` over correlated pairs (should be 0).
    pub ip_bias: f64,
    /// Standard error of `ip_bias`.
    pub ip_bias_stderr: f64,
    /// Mean of `<y, x̂_mse> - <y, x>` of `TurboQuant_mse` at `b` bits, same pairs (biased).
    pub mse_ip_bias: f64,
    /// Standard error of `mse_ip_bias`.
    pub mse_ip_bias_stderr: f64,
    /// Predicted MSE bias `-D_mse(b) · mean <x, y>`.
    pub mse_ip_bias_theory: f64,
    /// Mean `<x, y>` of the correlated pairs.
    pub mean_xy: f64,
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Mean and standard error of the mean.
fn mean_se(v: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let n = v.clone().count() as f64;
    if n == 0.0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = v.clone().sum::<f64>() / n;
    let var = if n > 1.0 {
        v.map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, (var / n).sqrt())
}

/// The 4-row distortion table for dimension `d` (at least 3) over `samples` unit vectors.
///
/// `progress` is called on the calling thread with the number of (bit width, sample) pairs done so
/// far, out of `4 · samples`, after every few hundred samples and at the end of each bit width.
pub fn distortion_table(
    d: usize,
    samples: usize,
    seed: u64,
    progress: &dyn Fn(usize),
) -> Vec<DistortionRow> {
    assert!(d >= 3, "the distortion table needs d >= 3 (got {d})");
    let groups = samples.div_ceil(QUANTIZER_REFRESH);
    let mut rows = Vec::with_capacity(4);
    for bits in 1u8..=4 {
        let mut per_sample: Vec<[f64; 5]> = Vec::with_capacity(samples);
        let mut g0 = 0;
        while g0 < groups {
            let g1 = (g0 + GROUPS_PER_REPORT).min(groups);
            let chunk: Vec<Vec<[f64; 5]>> = (g0..g1)
                .into_par_iter()
                .map(|g| {
                    let qs = derive_seed(seed, &[TAG_QUANTIZER, bits as u64, g as u64]);
                    let mse = MseQuantizer::new(d, bits, derive_seed(qs, &[1]));
                    let prod = ProdQuantizer::new(d, bits, d, derive_seed(qs, &[2]));
                    let hi = ((g + 1) * QUANTIZER_REFRESH).min(samples);
                    (g * QUANTIZER_REFRESH..hi)
                        .map(|s| {
                            // the same vectors for every bit width
                            let mut rng =
                                SeededRng::new(derive_seed(seed, &[TAG_SAMPLE, s as u64]));
                            let x = rng.unit_vector(d);
                            let y = rng.unit_vector(d);
                            let w = rng.unit_vector(d);
                            let yc: Vec<f32> = {
                                let s: Vec<f32> = x.iter().zip(&w).map(|(a, b)| a + b).collect();
                                let n = dot(&s, &s).sqrt() as f32;
                                s.iter().map(|v| v / n).collect()
                            };
                            let xh = mse.dequantize(&mse.quantize(&x));
                            let mse_err: f64 = x
                                .iter()
                                .zip(&xh)
                                .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
                                .sum();
                            let code = prod.quantize(&x);
                            let err_ind =
                                prod.estimate(&prod.prepare_query(&y), &code) as f64 - dot(&y, &x);
                            let xy = dot(&yc, &x);
                            let err_cor =
                                prod.estimate(&prod.prepare_query(&yc), &code) as f64 - xy;
                            let mse_cor = dot(&yc, &xh) - xy;
                            [mse_err, err_ind, err_cor, mse_cor, xy]
                        })
                        .collect()
                })
                .collect();
            per_sample.extend(chunk.into_iter().flatten());
            g0 = g1;
            progress((bits as usize - 1) * samples + per_sample.len());
        }
        let col = |k: usize| per_sample.iter().map(move |r| r[k]);
        let (mse, mse_stderr) = mean_se(col(0));
        let (ipd, ipd_se) = mean_se(col(1).map(|e| e * e * d as f64));
        let (ip_bias, ip_bias_stderr) = mean_se(col(2));
        let (mse_ip_bias, mse_ip_bias_stderr) = mean_se(col(3));
        let (mean_xy, _) = mean_se(col(4));
        let b = bits as usize;
        let mse_theory = codebook(bits, d).distortion();
        let prev = codebook(bits - 1, d).distortion();
        let pi = std::f64::consts::PI;
        rows.push(DistortionRow {
            bits,
            d,
            samples,
            mse,
            mse_stderr,
            mse_theory,
            mse_published: PUBLISHED_MSE[b - 1],
            mse_bound: 3f64.sqrt() * pi / 2.0 * 4f64.powi(-(bits as i32)),
            ip_distortion: ipd,
            ip_distortion_stderr: ipd_se,
            ip_distortion_theory: (pi / 2.0 - 1.0 / d as f64) * prev,
            ip_distortion_published: PUBLISHED_IP[b - 1],
            ip_distortion_bound: 3f64.sqrt() * pi * pi * 4f64.powi(-(bits as i32)),
            ip_bias,
            ip_bias_stderr,
            mse_ip_bias,
            mse_ip_bias_stderr,
            mse_ip_bias_theory: -mse_theory * mean_xy,
            mean_xy,
        });
    }
    rows
}
