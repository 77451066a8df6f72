//! The exact attention reference, in `f64`, for every shape the problem types describe.
//!
//! Returns O and LSE. Rows with no visible key (an empty sequence, a causal row before the
//! first key, padding past `seqlens_q`) get O = 0 and LSE = `-inf`, as FlashAttention does.

use crate::{AttentionInputs, AttentionOutput, AttentionProblem, DType, Provenance, Tensor};
use rayon::prelude::*;

/// Exact attention in `f64`, rounded to `f32` at the end (O also to the problem's dtype).
pub fn exact_attention(p: &AttentionProblem, x: &AttentionInputs) -> AttentionOutput {
    let (o, lse) = exact_attention_f64(p, x);
    let o = Tensor {
        shape: vec![p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v],
        dtype: p.dtype,
        data: o.into_iter().map(|v| p.dtype.round(v as f32)).collect(),
    };
    let lse = Tensor {
        shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
        dtype: DType::F32,
        data: lse.into_iter().map(|v| v as f32).collect(),
    };
    AttentionOutput {
        o,
        lse,
        provenance: Provenance {
            device: "f64 golden reference".into(),
            ..Provenance::cpu()
        },
    }
}

/// Exact attention kept in `f64`: O `[B, Sq, Hq, Dv]` and LSE `[B, Hq, Sq]` as flat vectors.
pub fn exact_attention_f64(p: &AttentionProblem, x: &AttentionInputs) -> (Vec<f64>, Vec<f64>) {
    let (sq, hq, dv, dk) = (p.max_seqlen_q, p.heads_q, p.head_dim_v, p.head_dim_qk);
    let group = p.group_size();
    let scale = p.softmax_scale as f64;
    // one task per (b, h): rows of O are strided, so compute per task and scatter after
    let rows: Vec<(usize, usize, Vec<f64>, Vec<f64>)> = (0..p.batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let hk = h / group;
            let mut o = vec![0.0f64; sq * dv];
            let mut lse = vec![f64::NEG_INFINITY; sq];
            let mut s = Vec::new();
            for i in 0..p.seqlens_q[b] {
                let end = p.visible_keys(b, i);
                if end == 0 {
                    continue;
                }
                let qr = x.q.row4(b, i, h);
                s.clear();
                for j in 0..end {
                    let kr = &x.k.row4(b, j, hk)[..dk];
                    let dot: f64 = qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    s.push(dot * scale);
                }
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let mut l = 0.0;
                let orow = &mut o[i * dv..(i + 1) * dv];
                for (j, &sj) in s.iter().enumerate() {
                    let w = (sj - m).exp();
                    l += w;
                    for (acc, &vv) in orow.iter_mut().zip(x.v_row(p, b, j, hk)) {
                        *acc += w * vv as f64;
                    }
                }
                for acc in orow.iter_mut() {
                    *acc /= l;
                }
                lse[i] = m + l.ln();
            }
            (b, h, o, lse)
        })
        .collect();
    let mut o = vec![0.0f64; p.batch * sq * hq * dv];
    let mut lse = vec![f64::NEG_INFINITY; p.batch * hq * sq];
    for (b, h, ob, lb) in rows {
        for i in 0..sq {
            let dst = ((b * sq + i) * hq + h) * dv;
            o[dst..dst + dv].copy_from_slice(&ob[i * dv..(i + 1) * dv]);
        }
        lse[(b * hq + h) * sq..(b * hq + h + 1) * sq].copy_from_slice(&lb);
    }
    (o, lse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttentionOptions, Tensor};

    fn inputs(b: usize, sq: usize, sk: usize, hq: usize, hk: usize, d: usize) -> AttentionInputs {
        let f = |n: usize, salt: f32| {
            (0..n)
                .map(|i| ((i as f32) * 0.37 + salt).sin())
                .collect::<Vec<_>>()
        };
        AttentionInputs::new(
            Tensor::from_vec(&[b, sq, hq, d], DType::F32, f(b * sq * hq * d, 0.1)).unwrap(),
            Tensor::from_vec(&[b, sk, hk, d], DType::F32, f(b * sk * hk * d, 0.7)).unwrap(),
            Tensor::from_vec(&[b, sk, hk, d], DType::F32, f(b * sk * hk * d, 1.3)).unwrap(),
        )
    }

    #[test]
    fn one_key_gives_its_value_and_its_logit() {
        let x = inputs(1, 1, 1, 2, 1, 4);
        let p = x.problem(AttentionOptions::default(), None).unwrap();
        let (o, lse) = exact_attention_f64(&p, &x);
        for h in 0..2 {
            let dot: f64 =
                x.q.row4(0, 0, h)
                    .iter()
                    .zip(x.k.row4(0, 0, 0))
                    .map(|(a, b)| (*a as f64) * (*b as f64))
                    .sum();
            assert!((lse[h] - dot * 0.5).abs() < 1e-12, "scale is 1/sqrt(4)");
            for c in 0..4 {
                assert!(
                    (o[h * 4 + c] - x.v.as_ref().unwrap().row4(0, 0, 0)[c] as f64).abs() < 1e-12
                );
            }
        }
    }

    #[test]
    fn causal_rows_before_the_first_key_are_zero_with_neg_inf_lse() {
        // Sq = 5 > Sk = 3: bottom-right alignment leaves queries 0 and 1 with no key
        let x = inputs(1, 5, 3, 1, 1, 8);
        let p = x
            .problem(
                AttentionOptions {
                    causal: true,
                    softmax_scale: None,
                },
                None,
            )
            .unwrap();
        assert_eq!(
            (0..5).map(|i| p.visible_keys(0, i)).collect::<Vec<_>>(),
            vec![0, 0, 1, 2, 3]
        );
        let (o, lse) = exact_attention_f64(&p, &x);
        assert_eq!(&lse[..2], &[f64::NEG_INFINITY; 2]);
        assert!(o[..16].iter().all(|&v| v == 0.0));
        assert!(lse[2..].iter().all(|v| v.is_finite()));
        // query 2 sees exactly key 0
        for c in 0..8 {
            assert!((o[16 + c] - x.v.as_ref().unwrap().row4(0, 0, 0)[c] as f64).abs() < 1e-12);
        }
    }

    #[test]
    fn ragged_and_empty_sequences() {
        let mut x = inputs(2, 2, 6, 4, 2, 8);
        x.seqlens_k = Some(vec![0, 4]);
        x.seqlens_q = Some(vec![2, 1]);
        let p = x.problem(AttentionOptions::default(), None).unwrap();
        let full = exact_attention(&p, &x);
        // sequence 0 has no keys: every row empty
        assert!(full.lse.data[..4 * 2]
            .iter()
            .all(|v| *v == f32::NEG_INFINITY));
        // sequence 1 row 1 is padding
        let lse_b1: Vec<f32> = (0..4).map(|h| full.lse.data[(4 + h) * 2 + 1]).collect();
        assert!(lse_b1.iter().all(|v| *v == f32::NEG_INFINITY));
        // sequence 1 equals a standalone problem over its first 4 keys
        let y = AttentionInputs {
            seqlens_q: None,
            seqlens_k: None,
            q: Tensor::from_vec(
                &[1, 1, 4, 8],
                DType::F32,
                (0..4).flat_map(|h| x.q.row4(1, 0, h).to_vec()).collect(),
            )
            .unwrap(),
            k: Tensor::from_vec(
                &[1, 4, 2, 8],
                DType::F32,
                x.k.data[6 * 2 * 8..6 * 2 * 8 + 4 * 2 * 8].to_vec(),
            )
            .unwrap(),
            v: Some(
                Tensor::from_vec(
                    &[1, 4, 2, 8],
                    DType::F32,
                    x.v.as_ref().unwrap().data[6 * 2 * 8..6 * 2 * 8 + 4 * 2 * 8].to_vec(),
                )
                .unwrap(),
            ),
        };
        let py = y.problem(AttentionOptions::default(), None).unwrap();
        let alone = exact_attention(&py, &y);
        for h in 0..4 {
            assert_eq!(full.o.row4(1, 0, h), alone.o.row4(0, 0, h));
        }
    }
}
