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

    /// Moves the reference to `m_new >= m` before a block of keys whose maximum is `m_new` is
    /// added: `l` and `acc` scaled by `exp(m - m_new)` (emptied from the empty state), `m = m_new`.
    pub fn rescale_to(&mut self, m_new: f32) {
        let alpha = if self.m == f32::NEG_INFINITY {
            0.0
        } else {
            (self.m - m_new).exp()
        };
        self.l *= alpha;
        self.acc.iter_mut().for_each(|a| *a *= alpha);
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn state_of(s: &[f32], v: &[Vec<f32>]) -> SoftmaxState {
        let mut st = SoftmaxState::empty(v.first().map_or(0, |r| r.len()));
        for (x, row) in s.iter().zip(v) {
            st.push(*x, row);
        }
        st
    }

    fn exact(s: &[f32], v: &[Vec<f32>]) -> (Vec<f64>, f64) {
        let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let w: Vec<f64> = s.iter().map(|&x| (x as f64 - m).exp()).collect();
        let l: f64 = w.iter().sum();
        let o = (0..v[0].len())
            .map(|c| w.iter().zip(v).map(|(w, r)| w * r[c] as f64).sum::<f64>() / l)
            .collect();
        (o, m + l.ln())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Lean appendix D: splitting the keys anywhere and merging in any grouping gives the
        /// state of the whole set (up to f32 rounding).
        #[test]
        fn merge_is_associative_and_exact(
            s in prop::collection::vec(-30.0f32..30.0, 1..60),
            cuts in prop::collection::vec(0usize..60, 0..5),
            seed in 0u64..1000,
        ) {
            let n = s.len();
            let v: Vec<Vec<f32>> = (0..n).map(|j| (0..3).map(|c| ((j * 7 + c * 13) as f32 + seed as f32).sin()).collect()).collect();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (n + 1)).collect();
            cuts.push(0);
            cuts.push(n);
            cuts.sort();
            let parts: Vec<SoftmaxState> = cuts.windows(2).map(|w| state_of(&s[w[0]..w[1]], &v[w[0]..w[1]])).collect();
            // left fold and right fold
            let mut left = SoftmaxState::empty(3);
            for p in &parts { left.merge(p); }
            let mut right = SoftmaxState::empty(3);
            for p in parts.iter().rev() { let mut t = p.clone(); t.merge(&right); right = t; }
            let (o_ref, lse_ref) = exact(&s, &v);
            for st in [&left, &right] {
                let (o, lse) = st.finish();
                prop_assert!((lse as f64 - lse_ref).abs() < 1e-4 * (1.0 + lse_ref.abs()));
                for (a, b) in o.iter().zip(&o_ref) {
                    prop_assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn empty_state_finishes_to_zero_and_neg_inf() {
        let (o, lse) = SoftmaxState::empty(4).finish();
        assert_eq!(o, vec![0.0; 4]);
        assert_eq!(lse, f32::NEG_INFINITY);
        let mut a = state_of(&[1.0, 2.0], &[vec![1.0], vec![3.0]]);
        let before = a.clone();
        a.merge(&SoftmaxState::empty(1));
        assert_eq!(a, before, "merging an empty state changes nothing");
    }
}
