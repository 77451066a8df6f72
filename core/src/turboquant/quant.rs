//! The two TurboQuant vector quantizers of arXiv 2504.19874.
//!
//! * [`MseQuantizer`] (`TurboQuant_mse`, Algorithm 1): keep `‖x‖`, rotate `x/‖x‖` by `Π`, replace
//!   each coordinate with the index of its nearest Lloyd-Max centroid. Dequantize: look the
//!   centroids up, rotate back with `Πᵀ`, multiply by the norm.
//! * [`ProdQuantizer`] (`TurboQuant_prod`, Algorithm 2): `b - 1` bits of `TurboQuant_mse`, then the
//!   1-bit QJL sketch (Zandieh et al. 2024) of the residual `r = x - x_mse`: `sign(S r)` with
//!   `S ∈ R^(m x d)`, `S_ij ~ N(0, 1)`, and `‖r‖`. Inner products are estimated as
//!
//!   `<q, x> ≈ <q, x_mse> + ‖r‖ · √(π/2) / m · <S q, sign(S r)>`,
//!
//!   which is unbiased because `E[<s, q> sign(<s, r>)] = √(2/π) <q, r> / ‖r‖` for a Gaussian row
//!   `s`. The paper takes `m = d` (`S ∈ R^(d x d)`); `m` is a parameter here.
//!
//! Both work on any norm: the paper's analysis is for unit vectors, and a general `x` is stored as
//! `‖x‖` plus the code of `x / ‖x‖`. With `k = ‖k‖ u` the prod code keeps `‖k‖` and the residual
//! norm of `k` itself, `‖k - k_mse‖ = ‖k‖ · ‖u - u_mse‖`, which is the `R_norms` operand of the
//! fused kernel.

use super::codebook::{codebook, Codebook, MAX_CODEBOOK_BITS};
use super::rng::{derive_seed, SeededRng};
use super::rotation::Rotation;
use std::sync::Arc;

/// Label of the rotation in [`derive_seed`] paths.
pub const TAG_ROTATION: u64 = 0x524f_5441_5449_4f4e; // "ROTATION"
/// Label of the QJL projection in [`derive_seed`] paths.
pub const TAG_QJL: u64 = 0x514a_4c53_4b45_5443; // "QJLSKETC"

/// Seed of the `d x d` rotation drawn for a config seed. Keys and values of equal head dim share
/// it, as the fused kernel shares one `Π`.
pub fn rotation_seed(seed: u64, d: usize) -> u64 {
    derive_seed(seed, &[TAG_ROTATION, d as u64])
}

/// Seed of the `m x d` QJL projection drawn for a config seed.
pub fn sketch_seed(seed: u64, d: usize, m: usize) -> u64 {
    derive_seed(seed, &[TAG_QJL, d as u64, m as u64])
}

fn l2(x: &[f32]) -> f32 {
    x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32
}

/// An MSE code: the norm and one centroid index per rotated coordinate.
#[derive(Clone, Debug, PartialEq)]
pub struct MseCode {
    /// `‖x‖`.
    pub norm: f32,
    /// Centroid index of each coordinate of `Π x / ‖x‖`.
    pub idx: Vec<u8>,
}

/// `TurboQuant_mse`: rotation plus a per-coordinate Lloyd-Max codebook.
#[derive(Clone, Debug)]
pub struct MseQuantizer {
    rotation: Arc<Rotation>,
    codebook: Arc<Codebook>,
}

impl MseQuantizer {
    /// A `bits`-bit quantizer for `R^d` whose rotation comes from `seed` (via [`rotation_seed`]).
    pub fn new(d: usize, bits: u8, seed: u64) -> MseQuantizer {
        MseQuantizer::from_parts(
            Arc::new(Rotation::new(d, rotation_seed(seed, d))),
            codebook(bits, d),
        )
    }

    /// From a rotation and a codebook of the same dimension.
    pub fn from_parts(rotation: Arc<Rotation>, codebook: Arc<Codebook>) -> MseQuantizer {
        assert_eq!(
            rotation.dim(),
            codebook.dim(),
            "rotation and codebook dimensions differ"
        );
        MseQuantizer { rotation, codebook }
    }

    /// Dimension `d`.
    pub fn dim(&self) -> usize {
        self.rotation.dim()
    }

    /// Bits per coordinate.
    pub fn bits(&self) -> u8 {
        self.codebook.bits()
    }

    /// The rotation `Π`.
    pub fn rotation(&self) -> &Arc<Rotation> {
        &self.rotation
    }

    /// The codebook.
    pub fn codebook(&self) -> &Arc<Codebook> {
        &self.codebook
    }

    /// Writes the indices of `x` into `idx` (length `d`) and returns `‖x‖`; `rot` is scratch of
    /// length `d` and ends up holding `Π x / ‖x‖`.
    pub fn quantize_into(&self, x: &[f32], idx: &mut [u8], rot: &mut [f32]) -> f32 {
        let n = l2(x);
        if n > 0.0 {
            let inv = 1.0 / n;
            let u: Vec<f32> = x.iter().map(|&v| v * inv).collect();
            self.rotation.apply(&u, rot);
        } else {
            rot.iter_mut().for_each(|r| *r = 0.0);
        }
        for (i, &t) in idx.iter_mut().zip(rot.iter()) {
            *i = self.codebook.index(t);
        }
        n
    }

    /// Quantizes `x`.
    pub fn quantize(&self, x: &[f32]) -> MseCode {
        let d = self.dim();
        let mut idx = vec![0u8; d];
        let mut rot = vec![0.0f32; d];
        let norm = self.quantize_into(x, &mut idx, &mut rot);
        MseCode { norm, idx }
    }

    /// `norm · c[idx]`: the reconstruction still in the rotated domain.
    pub fn dequantize_rotated(&self, norm: f32, idx: &[u8], out: &mut [f32]) {
        for (o, &i) in out.iter_mut().zip(idx) {
            *o = norm * self.codebook.centroid(i);
        }
    }

    /// `‖x‖ · Πᵀ c[idx]`.
    pub fn dequantize(&self, code: &MseCode) -> Vec<f32> {
        let d = self.dim();
        let mut rot = vec![0.0f32; d];
        let mut out = vec![0.0f32; d];
        self.dequantize_rotated(code.norm, &code.idx, &mut rot);
        self.rotation.apply_t(&rot, &mut out);
        out
    }
}

/// The 1-bit QJL sketch: a Gaussian `m x d` projection `S`.
#[derive(Clone, Debug, PartialEq)]
pub struct QjlSketch {
    d: usize,
    m: usize,
    seed: u64,
    s: Vec<f32>,
}

impl QjlSketch {
    /// `S ∈ R^(m x d)` with i.i.d. `N(0, 1)` entries drawn from `seed`.
    pub fn new(d: usize, m: usize, seed: u64) -> QjlSketch {
        assert!(d >= 1 && m >= 1, "QJL needs d >= 1 and m >= 1");
        let mut rng = SeededRng::new(seed);
        let s = (0..m * d).map(|_| rng.normal() as f32).collect();
        QjlSketch { d, m, seed, s }
    }

    /// Input dimension `d`.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// Sketch rows `m`.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// The seed it was drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Row-major `m x d` entries of `S`.
    pub fn matrix(&self) -> &[f32] {
        &self.s
    }

    /// Bytes of one packed sign row, `ceil(m / 8)`.
    pub fn sign_bytes(&self) -> usize {
        self.m.div_ceil(8)
    }

    /// `√(π/2) / m`, the factor of `‖r‖ · <S q, signs>`.
    pub fn correction_scale(&self) -> f32 {
        ((std::f64::consts::PI / 2.0).sqrt() / self.m as f64) as f32
    }

    /// `out = S x` (length `m`); for a query this is the `Q_proj` operand of the fused kernel.
    pub fn project(&self, x: &[f32], out: &mut [f32]) {
        for (o, row) in out.iter_mut().zip(self.s.chunks_exact(self.d)) {
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// Packs `sign(S r)` into `out` (`ceil(m/8)` bytes, bit `i % 8` of byte `i / 8`, LSB first;
    /// 1 means `+1`, and `sign(0) = +1`).
    pub fn signs_into(&self, r: &[f32], out: &mut [u8]) {
        out.iter_mut().for_each(|b| *b = 0);
        for (i, row) in self.s.chunks_exact(self.d).enumerate() {
            let v: f32 = row.iter().zip(r).map(|(a, b)| a * b).sum();
            if v >= 0.0 {
                out[i / 8] |= 1 << (i % 8);
            }
        }
    }

    /// `±1` values of packed signs into `out` (length `m`).
    pub fn unpack_signs(&self, signs: &[u8], out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = if signs[i / 8] >> (i % 8) & 1 == 1 {
                1.0
            } else {
                -1.0
            };
        }
    }

    /// `<S q, z>` for packed signs `z` and a projected query `S q`.
    pub fn dot_signs(&self, q_proj: &[f32], signs: &[u8]) -> f32 {
        q_proj
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if signs[i / 8] >> (i % 8) & 1 == 1 {
                    v
                } else {
                    -v
                }
            })
            .sum()
    }

    /// Adds `γ · √(π/2)/m · Sᵀ z` to `out` (QJL dequantization of a residual of norm `γ`).
    pub fn add_dequantized(&self, signs: &[u8], gamma: f32, out: &mut [f32]) {
        let c = gamma * self.correction_scale();
        for (i, row) in self.s.chunks_exact(self.d).enumerate() {
            let z = if signs[i / 8] >> (i % 8) & 1 == 1 {
                c
            } else {
                -c
            };
            for (o, &a) in out.iter_mut().zip(row) {
                *o += z * a;
            }
        }
    }
}

/// A prod code: MSE part, QJL signs of the residual and the residual's norm.
#[derive(Clone, Debug, PartialEq)]
pub struct ProdCode {
    /// `‖x‖`.
    pub norm: f32,
    /// `b - 1`-bit centroid indices (all pointing at the single centroid 0 when `b = 1`).
    pub idx: Vec<u8>,
    /// Packed `sign(S r)`.
    pub signs: Vec<u8>,
    /// `‖r‖ = ‖x - x_mse‖` (already multiplied by `‖x‖`).
    pub r_norm: f32,
}

/// A query prepared for [`ProdQuantizer::estimate`]: rotated once, projected once.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedQuery {
    /// `Π q` (scores against MSE keys are taken in the rotated domain).
    pub rot: Vec<f32>,
    /// `S q`.
    pub proj: Vec<f32>,
}

/// `TurboQuant_prod`: `(b-1)`-bit MSE stage plus a 1-bit QJL sketch of the residual.
#[derive(Clone, Debug)]
pub struct ProdQuantizer {
    bits: u8,
    mse: MseQuantizer,
    qjl: QjlSketch,
}

impl ProdQuantizer {
    /// A `bits`-bit (`1..=MAX_CODEBOOK_BITS + 1`) quantizer for `R^d` with an `m`-row sketch.
    pub fn new(d: usize, bits: u8, m: usize, seed: u64) -> ProdQuantizer {
        assert!(
            (1..=MAX_CODEBOOK_BITS + 1).contains(&bits),
            "prod quantizer bits must be 1..={} (got {bits})",
            MAX_CODEBOOK_BITS + 1
        );
        let mse = MseQuantizer::new(d, bits - 1, seed);
        ProdQuantizer {
            bits,
            mse,
            qjl: QjlSketch::new(d, m, sketch_seed(seed, d, m)),
        }
    }

    /// From an MSE stage (of `bits - 1` bits) and a sketch of the same dimension.
    pub fn from_parts(mse: MseQuantizer, qjl: QjlSketch) -> ProdQuantizer {
        assert_eq!(
            mse.dim(),
            qjl.dim(),
            "MSE stage and sketch dimensions differ"
        );
        ProdQuantizer {
            bits: mse.bits() + 1,
            mse,
            qjl,
        }
    }

    /// Total bits per coordinate, `b`.
    pub fn bits(&self) -> u8 {
        self.bits
    }

    /// Dimension `d`.
    pub fn dim(&self) -> usize {
        self.mse.dim()
    }

    /// The `b - 1`-bit MSE stage.
    pub fn mse(&self) -> &MseQuantizer {
        &self.mse
    }

    /// The QJL sketch.
    pub fn qjl(&self) -> &QjlSketch {
        &self.qjl
    }

    /// Quantizes `x`.
    pub fn quantize(&self, x: &[f32]) -> ProdCode {
        let d = self.dim();
        let mut idx = vec![0u8; d];
        let mut rot = vec![0.0f32; d];
        let mut signs = vec![0u8; self.qjl.sign_bytes()];
        let norm = self.mse.quantize_into(x, &mut idx, &mut rot);
        // residual of the unit vector, in the rotated domain, then back: r = Πᵀ (Π u - c[idx])
        for (r, &i) in rot.iter_mut().zip(&idx) {
            *r -= self.mse.codebook.centroid(i);
        }
        let mut r = vec![0.0f32; d];
        self.mse.rotation.apply_t(&rot, &mut r);
        let gamma = l2(&r);
        self.qjl.signs_into(&r, &mut signs);
        ProdCode {
            norm,
            idx,
            signs,
            r_norm: norm * gamma,
        }
    }

    /// Rotates and projects a query once.
    pub fn prepare_query(&self, q: &[f32]) -> PreparedQuery {
        let mut rot = vec![0.0f32; self.dim()];
        let mut proj = vec![0.0f32; self.qjl.rows()];
        if self.mse.bits() > 0 {
            self.mse.rotation.apply(q, &mut rot);
        }
        self.qjl.project(q, &mut proj);
        PreparedQuery { rot, proj }
    }

    /// The unbiased estimate of `<q, x>`:
    /// `‖x‖ <Π q, c[idx]> + ‖r‖ √(π/2)/m <S q, signs>`.
    pub fn estimate(&self, q: &PreparedQuery, code: &ProdCode) -> f32 {
        let term1: f32 = if self.mse.bits() > 0 {
            code.norm
                * q.rot
                    .iter()
                    .zip(&code.idx)
                    .map(|(&a, &i)| a * self.mse.codebook.centroid(i))
                    .sum::<f32>()
        } else {
            0.0
        };
        let term2 = self.qjl.dot_signs(&q.proj, &code.signs);
        term1 + code.r_norm * self.qjl.correction_scale() * term2
    }

    /// `x_mse + ‖r‖ √(π/2)/m Sᵀ signs`; its inner product with any `q` equals [`Self::estimate`].
    pub fn dequantize(&self, code: &ProdCode) -> Vec<f32> {
        let mut out = if self.mse.bits() > 0 {
            self.mse.dequantize(&MseCode {
                norm: code.norm,
                idx: code.idx.clone(),
            })
        } else {
            vec![0.0f32; self.dim()]
        };
        self.qjl.add_dequantized(&code.signs, code.r_norm, &mut out);
        out
    }
}
