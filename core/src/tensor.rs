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
