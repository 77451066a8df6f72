//! Exact attention on the CPU: FlashAttention-style blocked online softmax in `f32`.
//!
//! Keys are visited in blocks of `block_k`; within a block the scores are computed first and
//! the running state is rescaled once per block (FlashAttention-2, Alg. 1), which is the
//! arithmetic order of a GPU kernel. Output is rounded to the problem's dtype.

use ferrattn_core::{
    AttentionInputs, AttentionOutput, AttentionProblem, DType, Provenance, SoftmaxState, Tensor,
};
use rayon::prelude::*;

/// Blocked exact attention; rows with no visible key get O = 0 and LSE = -inf.
pub fn blocked_attention(
    p: &AttentionProblem,
    x: &AttentionInputs,
    block_k: usize,
) -> AttentionOutput {
    let (sq, hq, dv) = (p.max_seqlen_q, p.heads_q, p.head_dim_v);
    let group = p.group_size();
    let block_k = block_k.max(1);
    let rows: Vec<(Vec<f32>, f32)> = (0..p.batch * sq * hq)
        .into_par_iter()
        .map(|idx| {
            let (b, i, h) = (idx / (sq * hq), (idx / hq) % sq, idx % hq);
            if i >= p.seqlens_q[b] {
                return (vec![0.0; dv], f32::NEG_INFINITY);
            }
            let end = p.visible_keys(b, i);
            let hk = h / group;
            // scale before the dot product: the logit range is what must fit f32
            // (ferrattn_core::range)
            let q: Vec<f32> =
                x.q.row4(b, i, h)
                    .iter()
                    .map(|&v| v * p.softmax_scale)
                    .collect();
            let mut st = SoftmaxState::empty(dv);
            let mut s = Vec::with_capacity(block_k);
            for j0 in (0..end).step_by(block_k) {
                let j1 = (j0 + block_k).min(end);
                s.clear();
                s.extend((j0..j1).map(|j| {
                    let k = &x.k.row4(b, j, hk)[..p.head_dim_qk];
                    q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>()
                }));
                let mut blk = SoftmaxState::empty(dv);
                blk.m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                for (jj, &sj) in s.iter().enumerate() {
                    let w = (sj - blk.m).exp();
                    blk.l += w;
                    for (a, &v) in blk.acc.iter_mut().zip(x.v_row(p, b, j0 + jj, hk)) {
                        *a += w * v;
                    }
                }
                st.merge(&blk);
            }
            st.finish()
        })
        .collect();
    let mut o = Tensor::zeros(&[p.batch, sq, hq, dv], p.dtype);
    let mut lse = Tensor::zeros(&[p.batch, hq, sq], DType::F32);
    for (idx, (row, l)) in rows.into_iter().enumerate() {
        let (b, i, h) = (idx / (sq * hq), (idx / hq) % sq, idx % hq);
        for (dst, v) in o.row4_mut(b, i, h).iter_mut().zip(row) {
            *dst = p.dtype.round(v);
        }
        lse.data[(b * hq + h) * sq + i] = l;
    }
    AttentionOutput {
        o,
        lse,
        provenance: Provenance::cpu(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrattn_core::golden::exact_attention;
    use ferrattn_core::{AttentionOptions, Comparison, Tolerance};
    use rand::SeedableRng;

    #[test]
    fn blocked_equals_golden_for_every_block_size_and_mask() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for (dtype, causal, sq, sk) in [
            (DType::F32, true, 37, 65),
            (DType::F16, false, 3, 577),
            (DType::BF16, true, 65, 63),
        ] {
            let q = Tensor::randn(&[2, sq, 4, 32], dtype, 1.0, &mut rng);
            let k = Tensor::randn(&[2, sk, 2, 32], dtype, 1.0, &mut rng);
            let v = Tensor::randn(&[2, sk, 2, 32], dtype, 1.0, &mut rng);
            let mut x = AttentionInputs::new(q, k, v);
            x.seqlens_k = Some(vec![sk as i64, (sk / 2) as i64]);
            let p = x
                .problem(
                    AttentionOptions {
                        causal,
                        softmax_scale: None,
                    },
                    None,
                )
                .unwrap();
            let gold = exact_attention(&p, &x);
            for block in [1, 16, 64, 1000] {
                let out = blocked_attention(&p, &x, block);
                Comparison::f32(&gold.o.data, &out.o.data)
                    .check("O", &Tolerance::output(dtype))
                    .unwrap();
                Comparison::f32(&gold.lse.data, &out.lse.data)
                    .check("LSE", &Tolerance::lse())
                    .unwrap();
            }
        }
    }
}
