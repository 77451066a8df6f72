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
