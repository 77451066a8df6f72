//! The online-softmax state and its merge (LeanAttention appendix D).
//!
//! A state summarises attention of one query row over a subset `S` of keys:
//! `m = max_{j in S} s_j`, `l = sum_{j in S} exp(s_j - m)`, `acc = sum_{j in S} exp(s_j - m) v_j`.
//! Merging two states over disjoint subsets gives the state over their union; the merge is
//! associative and commutative, which is what lets stream-K split a row anywhere.

/// Partial softmax state of one query row.
#[derive(Clone, Debug, PartialEq)]
pub struct SoftmaxState {
    /// Maximum scaled logit seen so far (`-inf` when no key was seen).
    pub m: f32,
    /// Sum of `exp(s_j - m)` over the keys seen.
    pub l: f32,
    /// Unnormalised output `sum_j exp(s_j - m) v_j`, one entry per V column.
    pub acc: Vec<f32>,
}

impl SoftmaxState {
    /// The state over no keys.
    pub fn empty(dv: usize) -> SoftmaxState {
        SoftmaxState {
            m: f32::NEG_INFINITY,
            l: 0.0,
            acc: vec![0.0; dv],
        }
    }

    /// Adds one key with scaled logit `s` and value row `v`.
    pub fn push(&mut self, s: f32, v: &[f32]) {
        let m_new = self.m.max(s);
        let alpha = if self.m == f32::NEG_INFINITY {
            0.0
        } else {
            (self.m - m_new).exp()
        };
        let p = (s - m_new).exp();
        self.l = self.l * alpha + p;
        for (a, &x) in self.acc.iter_mut().zip(v) {
            *a = *a * alpha + p * x;
        }
        self.m = m_new;
    }

    /// Merges a state over a disjoint key set into this one.
    pub fn merge(&mut self, other: &SoftmaxState) {
        if other.m == f32::NEG_INFINITY {
            return;
        }
        if self.m == f32::NEG_INFINITY {
            *self = other.clone();
            return;
        }
        let m = self.m.max(other.m);
        let a = (self.m - m).exp();
        let b = (other.m - m).exp();
        self.l = self.l * a + other.l * b;
        for (x, &y) in self.acc.iter_mut().zip(&other.acc) {
            *x = *x * a + y * b;
        }
        self.m = m;
    }

    /// Normalised output row and LSE; zeros and `-inf` when no key was seen.
    pub fn finish(&self) -> (Vec<f32>, f32) {
        if self.l == 0.0 || self.m == f32::NEG_INFINITY {
            return (vec![0.0; self.acc.len()], f32::NEG_INFINITY);
        }
        let inv = 1.0 / self.l;
        (
            self.acc.iter().map(|x| x * inv).collect(),
            self.m + self.l.ln(),
        )
    }
}
