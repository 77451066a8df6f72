//! A minimal dense host tensor: row-major `f32` values already rounded to their [`DType`].

use crate::{CoreError, DType, Result};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};

/// Dense row-major host tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Storage type the values are representable in.
    pub dtype: DType,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize], dtype: DType) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            dtype,
            data: vec![0.0; shape.iter().product()],
        }
    }

    /// Builds a tensor from values, rounding each to `dtype`.
    pub fn from_vec(shape: &[usize], dtype: DType, data: Vec<f32>) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        if data.len() != n {
            return Err(CoreError::Shape {
                tensor: "tensor",
                actual: vec![data.len()],
                expected: format!("{n} values for shape {shape:?}"),
            });
        }
        let data = data.into_iter().map(|x| dtype.round(x)).collect();
        Ok(Tensor {
            shape: shape.to_vec(),
            dtype,
            data,
        })
    }

    /// Standard normal values times `scale`, rounded to `dtype`.
    pub fn randn(shape: &[usize], dtype: DType, scale: f32, rng: &mut impl Rng) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                let x: f32 = StandardNormal.sample(rng);
                dtype.round(x * scale)
            })
            .collect();
        Tensor {
            shape: shape.to_vec(),
            dtype,
            data,
        }
    }

    /// Uniform values in `[lo, hi)`, rounded to `dtype`.
    pub fn uniform(shape: &[usize], dtype: DType, lo: f32, hi: f32, rng: &mut impl Rng) -> Tensor {
        let n: usize = shape.iter().product();
        let data = (0..n).map(|_| dtype.round(rng.gen_range(lo..hi))).collect();
        Tensor {
            shape: shape.to_vec(),
            dtype,
            data,
        }
    }

    /// Checks that `data` holds exactly the values `shape` describes (the fields are public, so
    /// a caller can build a tensor whose data is shorter than its shape; every reader indexes
    /// by shape). `name` goes in the error.
    pub fn check_data(&self, name: &'static str) -> Result<()> {
        let n = crate::problem::check_buffer(name, &self.shape)?;
        if self.data.len() != n {
            return Err(CoreError::Shape {
                tensor: name,
                actual: self.shape.clone(),
                expected: format!(
                    "{n} values for that shape, but its data holds {}",
                    self.data.len()
                ),
            });
        }
        Ok(())
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut s = vec![1; self.shape.len()];
        for i in (0..self.shape.len().saturating_sub(1)).rev() {
            s[i] = s[i + 1] * self.shape[i + 1];
        }
        s
    }

    /// The contiguous innermost row at a 4-d index prefix `[a, b, c, :]`.
    pub fn row4(&self, a: usize, b: usize, c: usize) -> &[f32] {
        let d = self.shape[3];
        let off = ((a * self.shape[1] + b) * self.shape[2] + c) * d;
        &self.data[off..off + d]
    }

    /// Mutable innermost row at `[a, b, c, :]`.
    pub fn row4_mut(&mut self, a: usize, b: usize, c: usize) -> &mut [f32] {
        let d = self.shape[3];
        let off = ((a * self.shape[1] + b) * self.shape[2] + c) * d;
        &mut self.data[off..off + d]
    }

    /// Positions `from..from + len` of axis 1 of a `[B, S, H, D]` tensor (every batch entry),
    /// as a new `[B, len, H, D]` tensor: a sequence's prefix, or one decode step's tokens.
    ///
    /// Panics when the range passes the end of axis 1 (a caller's indexing bug, not input).
    pub fn seq_range(&self, from: usize, len: usize) -> Tensor {
        let (b, s, h, d) = (self.shape[0], self.shape[1], self.shape[2], self.shape[3]);
        assert!(from + len <= s, "positions {from}..{} of {s}", from + len);
        let mut data = Vec::with_capacity(b * len * h * d);
        for bi in 0..b {
            let row = (bi * s + from) * h * d;
            data.extend_from_slice(&self.data[row..row + len * h * d]);
        }
        Tensor {
            shape: vec![b, len, h, d],
            dtype: self.dtype,
            data,
        }
    }

    /// First non-finite element, if any.
    pub fn first_non_finite(&self) -> Option<(usize, f32)> {
        self.data
            .iter()
            .enumerate()
            .find(|(_, x)| !x.is_finite())
            .map(|(i, x)| (i, *x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{amla, turbo, turboquant, AttentionInputs, AttentionOptions, DeviceCaps};
    use rand::{rngs::StdRng, SeedableRng};

    fn shorten(t: &mut Tensor) {
        let n = t.data.len();
        t.data.truncate(n - 3);
    }

    // issue 9: the emulations take a problem and inputs separately, and `Tensor`'s fields are
    // public: inputs whose shape matches the problem but whose data is shorter used to panic on
    // a slice index in turbo, turboquant and AMLA (lean checked it already); now `CoreError::Shape`
    #[test]
    fn emulations_refuse_tensors_shorter_than_their_shape() {
        let mut rng = StdRng::seed_from_u64(9);
        let caps = DeviceCaps::cpu(2);
        let r = |s: &[usize], rng: &mut StdRng| Tensor::randn(s, DType::F32, 1.0, rng);
        let x = AttentionInputs::new(
            r(&[2, 1, 4, 64], &mut rng),
            r(&[2, 40, 2, 64], &mut rng),
            r(&[2, 40, 2, 64], &mut rng),
        );
        let p = x.problem(AttentionOptions::default(), None).unwrap();
        let tcfg = turbo::plan(&p, &caps).unwrap();
        let qcfg = turboquant::plan(&p, &caps).unwrap();
        for which in ["q", "k", "v"] {
            let mut bad = x.clone();
            match which {
                "q" => shorten(&mut bad.q),
                "k" => shorten(&mut bad.k),
                _ => shorten(bad.v.as_mut().unwrap()),
            }
            let e = turbo::emulate(&tcfg, &p, &bad).unwrap_err();
            assert!(
                matches!(e, CoreError::Shape { tensor, .. } if tensor == which),
                "{e}"
            );
            let e = turboquant::emulate(&qcfg, &p, &bad).unwrap_err();
            assert!(
                matches!(e, CoreError::Shape { tensor, .. } if tensor == which),
                "{e}"
            );
            if which != "q" {
                let e = turbo::TurboKvCache::from_context(
                    &tcfg,
                    &bad.k,
                    bad.v.as_ref().unwrap(),
                    &[40, 40],
                )
                .unwrap_err();
                assert!(
                    matches!(e, CoreError::Shape { tensor, .. } if tensor == which),
                    "{e}"
                );
            }
        }
        let b = |s: &[usize], rng: &mut StdRng| Tensor::randn(s, DType::BF16, 1.0, rng);
        let m = AttentionInputs::mla(b(&[1, 1, 4, 576], &mut rng), b(&[1, 33, 1, 576], &mut rng));
        let p = m.problem(AttentionOptions::default(), Some(512)).unwrap();
        let plan = amla::plan(&p, &caps).unwrap();
        for which in ["q", "kv"] {
            let mut bad = m.clone();
            shorten(if which == "q" { &mut bad.q } else { &mut bad.k });
            let e = amla::emulate(&plan, &p, &bad).unwrap_err();
            assert!(
                matches!(e, CoreError::Shape { tensor, .. } if tensor == which),
                "{e}"
            );
        }
    }
}
