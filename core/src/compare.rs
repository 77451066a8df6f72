//! A comparator that explains failures, and typed tolerances per dtype.

use crate::DType;
use serde::Serialize;

/// How far `actual` is from `reference`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// Elements compared.
    pub len: usize,
    /// Largest `|actual - reference|` over finite pairs.
    pub max_abs: f64,
    /// Flat index of `max_abs`.
    pub max_abs_index: usize,
    /// `||actual - reference||_F / ||reference||_F` over finite pairs (0 when both are zero).
    pub rel_fro: f64,
    /// Cosine similarity of the two vectors over finite pairs (1 when both are zero).
    pub cosine: f64,
    /// First index where one side is NaN/Inf and the other is not, or they differ in kind.
    pub non_finite_mismatch: Option<usize>,
}

impl Comparison {
    /// Compares two equally long slices.
    pub fn new(reference: &[f64], actual: &[f64]) -> Comparison {
        assert_eq!(
            reference.len(),
            actual.len(),
            "comparator needs equal lengths"
        );
        let mut c = Comparison {
            len: reference.len(),
            max_abs: 0.0,
            max_abs_index: 0,
            rel_fro: 0.0,
            cosine: 1.0,
            non_finite_mismatch: None,
        };
        let (mut diff2, mut ref2, mut act2, mut dot) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
        for (i, (&r, &a)) in reference.iter().zip(actual).enumerate() {
            if !r.is_finite() || !a.is_finite() {
                let same = (r.is_nan() && a.is_nan()) || (r.is_infinite() && r == a);
                if !same && c.non_finite_mismatch.is_none() {
                    c.non_finite_mismatch = Some(i);
                }
                continue;
            }
            let d = (a - r).abs();
            if d > c.max_abs {
                c.max_abs = d;
                c.max_abs_index = i;
            }
            diff2 += d * d;
            ref2 += r * r;
            act2 += a * a;
            dot += r * a;
        }
        c.rel_fro = if ref2 > 0.0 {
            (diff2 / ref2).sqrt()
        } else {
            diff2.sqrt()
        };
        c.cosine = if ref2 > 0.0 && act2 > 0.0 {
            dot / (ref2.sqrt() * act2.sqrt())
        } else if ref2 == 0.0 && act2 == 0.0 {
            1.0
        } else {
            0.0
        };
        c
    }

    /// Compares `f32` data against an `f32` reference.
    pub fn f32(reference: &[f32], actual: &[f32]) -> Comparison {
        let r: Vec<f64> = reference.iter().map(|&x| x as f64).collect();
        let a: Vec<f64> = actual.iter().map(|&x| x as f64).collect();
        Comparison::new(&r, &a)
    }

    /// `Ok` when within `tol`, else a message with every number needed to debug.
    pub fn check(&self, what: &str, tol: &Tolerance) -> Result<(), String> {
        if let Some(i) = self.non_finite_mismatch {
            return Err(format!(
                "{what}: NaN/Inf placement differs first at flat index {i}"
            ));
        }
        if self.rel_fro > tol.rel_fro || self.max_abs > tol.max_abs {
            return Err(format!(
                "{what}: rel_fro {:.3e} (tol {:.1e}), max_abs {:.3e} at {} (tol {:.1e}), cosine {:.6}",
                self.rel_fro, tol.rel_fro, self.max_abs, self.max_abs_index, tol.max_abs, self.cosine
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rel_fro {:.3e}  max_abs {:.3e} (at {})  cosine {:.6}",
            self.rel_fro, self.max_abs, self.max_abs_index, self.cosine
        )?;
        if let Some(i) = self.non_finite_mismatch {
            write!(f, "  NON-FINITE MISMATCH at {i}")?;
        }
        Ok(())
    }
}

/// Acceptance bounds for one comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Bound on the relative Frobenius error.
    pub rel_fro: f64,
    /// Bound on the largest absolute error.
    pub max_abs: f64,
}

impl Tolerance {
    /// Tolerance for O of an exact-attention kernel computing in `dtype` with f32 accumulation.
    /// bf16 has an 8-bit significand (2^-8 = 3.9e-3 relative rounding), f16 an 11-bit one.
    pub fn output(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance {
                rel_fro: 1e-5,
                max_abs: 1e-4,
            },
            DType::F16 => Tolerance {
                rel_fro: 2e-3,
                max_abs: 1e-2,
            },
            DType::BF16 => Tolerance {
                rel_fro: 1e-2,
                max_abs: 5e-2,
            },
        }
    }

    /// Tolerance for LSE (always f32, absolute error in natural-log units).
    pub fn lse() -> Tolerance {
        Tolerance {
            rel_fro: 1e-3,
            max_abs: 1e-3,
        }
    }

    /// Reordering the same f32 arithmetic (split points of a softmax) only.
    pub fn f32_reorder() -> Tolerance {
        Tolerance {
            rel_fro: 1e-5,
            max_abs: 1e-4,
        }
    }
}
