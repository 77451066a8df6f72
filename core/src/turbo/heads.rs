//! Head-wise mixed precision (TurboAttention section 3.2, Eq. 11-12).
//!
//! `priority(h) = gap(h) x std(h)` (Eq. 11), where, over the tokens the priority is measured on
//! and per tensor:
//! - `gap(h)` is "the difference between the maximum and minimum values across all channels for
//!   head h": `max_{t,c} x[t,c] - min_{t,c} x[t,c]`;
//! - `std(h)` is "the standard deviation of the channel-wise gaps within each head": with
//!   `g_c = max_t x[t,c] - min_t x[t,c]`, the population standard deviation of `g_0 .. g_{d-1}`.
//!
//! The paper does not say whether keys, values or both feed the score; one bit width applies to
//! both K and V of a head here, so the priority of a KV head is `priority(K) + priority(V)`.
//! Statistics are taken in `f64` over the valid context tokens of every sequence of the batch,
//! so every sequence of a batch shares one bit width per head (one kernel variant per head).
//!
//! Eq. 12: rank heads by ascending priority (ties: lower head index first); the first
//! `n_h = floor(fraction x heads_kv)` get 2 bits, the rest 4 bits. The paper's runs use
//! `fraction = 0.5`.

use crate::Tensor;

/// `gap x std` of one tensor of one head over the given rows (each `d` long); 0 for no rows.
pub fn tensor_priority<'a>(rows: impl IntoIterator<Item = &'a [f32]>, d: usize) -> f64 {
    let mut lo = vec![f64::INFINITY; d];
    let mut hi = vec![f64::NEG_INFINITY; d];
    let mut any = false;
    for row in rows {
        any = true;
        for (c, &x) in row.iter().enumerate() {
            lo[c] = lo[c].min(x as f64);
            hi[c] = hi[c].max(x as f64);
        }
    }
    if !any || d == 0 {
        return 0.0;
    }
    let gaps: Vec<f64> = hi.iter().zip(&lo).map(|(h, l)| h - l).collect();
    let gap = hi.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
        - lo.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = gaps.iter().sum::<f64>() / d as f64;
    let var = gaps.iter().map(|g| (g - mean) * (g - mean)).sum::<f64>() / d as f64;
    gap * var.sqrt()
}

/// Priority of every KV head of `k`, `v` (`[B, S, Hk, D]`) over the first `seqlens[b]` tokens of
/// each sequence: `priority(K) + priority(V)` per head.
pub fn head_priorities(k: &Tensor, v: &Tensor, seqlens: &[usize]) -> Vec<f64> {
    let heads = k.shape[2];
    (0..heads)
        .map(|h| {
            let rows = |t: &'static str| {
                let x = if t == "k" { k } else { v };
                let d = x.shape[3];
                let it = seqlens
                    .iter()
                    .enumerate()
                    .flat_map(move |(b, &n)| (0..n).map(move |j| x.row4(b, j, h)));
                tensor_priority(it, d)
            };
            rows("k") + rows("v")
        })
        .collect()
}

/// Number of 2-bit heads: `floor(fraction x heads)`.
pub fn two_bit_heads(fraction: f32, heads: usize) -> usize {
    ((fraction as f64 * heads as f64).floor() as usize).min(heads)
}

/// Bits per head (Eq. 12): the `n_two` lowest-priority heads get 2, the others 4.
pub fn assign_bits(priorities: &[f64], n_two: usize) -> Vec<u8> {
    let mut order: Vec<usize> = (0..priorities.len()).collect();
    order.sort_by(|&a, &b| priorities[a].total_cmp(&priorities[b]).then(a.cmp(&b)));
    let mut bits = vec![4u8; priorities.len()];
    for &h in order.iter().take(n_two) {
        bits[h] = 2;
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn turbo_priority_of_a_hand_computed_head() {
        // channel 0 spans [-1, 3] (gap 4), channel 1 spans [0, 2] (gap 2):
        // gap = 3 - (-1) = 4, channel gaps {4, 2}: std = 1, priority 4
        let rows: [&[f32]; 3] = [&[-1.0, 0.0], &[3.0, 2.0], &[0.0, 1.0]];
        assert_eq!(tensor_priority(rows, 2), 4.0);
        // equal channel gaps: std 0, priority 0 however large the range
        let rows: [&[f32]; 2] = [&[-50.0, -50.0], &[50.0, 50.0]];
        assert_eq!(tensor_priority(rows, 2), 0.0);
        assert_eq!(tensor_priority(std::iter::empty(), 4), 0.0);
    }

    /// Eight KV heads of Gaussian data; heads 1, 4 and 6 get outlier channels (one channel 20x,
    /// another 10x) in K, head 3 a single 10x channel in V. Those four must keep 4 bits, and
    /// the other four get 2 bits, whatever order the noise puts them in.
    #[test]
    fn turbo_priority_picks_outlier_heads_for_four_bits() {
        let (b, s, h, d) = (2, 40, 8, 64);
        let mut rng = StdRng::seed_from_u64(3);
        let mut k = Tensor::randn(&[b, s, h, d], DType::F32, 1.0, &mut rng);
        let mut v = Tensor::randn(&[b, s, h, d], DType::F32, 1.0, &mut rng);
        for bi in 0..b {
            for t in 0..s {
                for hh in [1usize, 4, 6] {
                    let r = k.row4_mut(bi, t, hh);
                    r[5] *= 20.0;
                    r[17] *= 10.0;
                }
                v.row4_mut(bi, t, 3)[40] *= 10.0;
            }
        }
        let pr = head_priorities(&k, &v, &[s, s]);
        let bits = assign_bits(&pr, two_bit_heads(0.5, h));
        assert_eq!(bits, vec![2, 4, 2, 4, 4, 2, 4, 2], "priorities {pr:?}");
        // the padded tail of a ragged batch is not looked at: poison it and nothing changes
        let mut k2 = k.clone();
        for hh in 0..h {
            k2.row4_mut(1, s - 1, hh)[0] = 1e6 * (hh + 1) as f32;
        }
        assert_eq!(
            head_priorities(&k2, &v, &[s, s - 1]),
            head_priorities(&k, &v, &[s, s - 1])
        );
    }

    #[test]
    fn turbo_two_bit_head_count_and_ties() {
        assert_eq!(two_bit_heads(0.5, 8), 4);
        assert_eq!(two_bit_heads(0.5, 3), 1);
        assert_eq!(two_bit_heads(0.5, 1), 0);
        assert_eq!(two_bit_heads(1.0, 5), 5);
        assert_eq!(two_bit_heads(0.0, 5), 0);
        // ties go to the lower head index
        assert_eq!(assign_bits(&[1.0, 1.0, 1.0, 1.0], 2), vec![2, 2, 4, 4]);
        assert_eq!(assign_bits(&[3.0, 1.0, 2.0], 1), vec![4, 2, 4]);
    }
}
