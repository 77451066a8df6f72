//! The seeded random rotation `Π` of TurboQuant (Algorithm 1, line 2 of arXiv 2504.19874).
//!
//! # Why a dense Haar rotation and not a randomized Hadamard transform
//!
//! * The paper's analysis (Lemma 1) needs `Π x` to be uniform on the sphere for every fixed unit
//!   `x`; then each coordinate follows the exact law `f(t) ∝ (1 - t²)^((d-3)/2)` that the Lloyd-Max
//!   codebooks are fitted to. A Haar-random orthogonal matrix gives exactly that; a randomized
//!   Hadamard transform (`H D`, random signs `D`) only approximates it and can fail badly on
//!   structured inputs (e.g. `x` a column of `H`, which `H D` maps to a basis vector).
//! * The fused-kernel write-up keeps `Π` as a dense `128 x 128` fp16 matrix resident in shared
//!   memory and un-rotates values with an MMA against it, so a dense matrix is what a kernel
//!   consumes anyway; at `d = 128` it costs 32 KB once per thread block.
//! * It works for every head dimension (64, 80, 96, 128, 192, 256, ...), not only powers of two.
//!
//! Construction: `d` rows of i.i.d. `N(0, 1)` values in `f64` from [`SeededRng`], orthonormalised
//! in order by classical Gram-Schmidt applied twice ("twice is enough", Giraud et al. 2005), which
//! is QR of a Gaussian matrix with a positive `R` diagonal and therefore exactly Haar distributed.
//! The rows are rounded to `f32` at the end; `Π Πᵀ = I` holds to about `1e-7`.

use super::rng::SeededRng;

/// A `d x d` orthogonal matrix, row-major, rebuilt bit for bit from `(d, seed)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rotation {
    d: usize,
    seed: u64,
    m: Vec<f32>,
}

impl Rotation {
    /// The rotation of dimension `d` (at least 1) drawn from `seed`.
    pub fn new(d: usize, seed: u64) -> Rotation {
        assert!(d >= 1, "rotation dimension must be at least 1");
        let mut rng = SeededRng::new(seed);
        let mut rows: Vec<Vec<f64>> = Vec::with_capacity(d);
        while rows.len() < d {
            let mut v: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
            for _pass in 0..2 {
                for q in &rows {
                    let dot: f64 = q.iter().zip(&v).map(|(a, b)| a * b).sum();
                    for (vi, qi) in v.iter_mut().zip(q) {
                        *vi -= dot * qi;
                    }
                }
            }
            let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
            // a Gaussian row lies in the span of the previous ones with probability 0; a
            // numerically tiny remainder is redrawn rather than amplified
            if n < 1e-6 {
                continue;
            }
            v.iter_mut().for_each(|x| *x /= n);
            rows.push(v);
        }
        let m = rows.into_iter().flatten().map(|x| x as f32).collect();
        Rotation { d, seed, m }
    }

    /// Dimension `d`.
    pub fn dim(&self) -> usize {
        self.d
    }

    /// The seed it was drawn from.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Row-major `d x d` entries; row `i` is the `i`-th rotated coordinate axis.
    pub fn matrix(&self) -> &[f32] {
        &self.m
    }

    /// `out = Π x`.
    pub fn apply(&self, x: &[f32], out: &mut [f32]) {
        let d = self.d;
        debug_assert!(x.len() == d && out.len() == d);
        for (o, row) in out.iter_mut().zip(self.m.chunks_exact(d)) {
            *o = row.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// `out = Πᵀ y` (the inverse rotation).
    pub fn apply_t(&self, y: &[f32], out: &mut [f32]) {
        let d = self.d;
        debug_assert!(y.len() == d && out.len() == d);
        out.iter_mut().for_each(|o| *o = 0.0);
        for (&yi, row) in y.iter().zip(self.m.chunks_exact(d)) {
            if yi != 0.0 {
                for (o, &r) in out.iter_mut().zip(row) {
                    *o += yi * r;
                }
            }
        }
    }
}
