//! Attention over a TurboQuant-compressed KV cache, in the dataflow of the fused kernel.
//!
//! The cache ([`CompressedKv`]) holds exactly the operands of the fused kernel
//! (`turboquant_fused_attention_vfused_*`), laid out `[batch, seq_k, heads_kv, ...]` like K and V:
//!
//! | operand   | here      | per (token, KV head)                                   |
//! |-----------|-----------|--------------------------------------------------------|
//! | `K_mse`   | `k_idx` + `k_norm` | `d_k` indices of `key_bits - 1` bits (`key_bits` without QJL), f16 `‖k‖` |
//! | `Signs`   | `k_signs` | `m / 8` bytes, `sign(S r)` LSB first (zero without QJL) |
//! | `R_norms` | `r_norm`  | f16 `‖k - k_mse‖` (zero without QJL)                  |
//! | `V_Indices` | `v_idx` | `d_v` indices of `value_bits` bits                     |
//! | `V_Norms` | `v_norm`  | f16 `‖v‖`                                              |
//! | `Pi`      | [`TurboQuantCodec`] | `d x d` rotation, shared by K and V when `d_k = d_v` |
//!
//! [`TurboQuantCodec::attend`] follows the kernel: one work item per `(sequence, KV head)` whose
//! query tile is every query row of the heads sharing that KV head (GQA). Each query row is rotated
//! once (`Π q`, scores against MSE keys are taken in the rotated domain) and projected once
//! (`Q_proj = S q`). Then, streaming KV blocks of `block_k` tokens:
//!
//! 1. decompress the K tile in the rotated domain: `‖k_j‖ · c[idx_j]`; unpack the sign tile to ±1;
//! 2. `term1 = (Π q) · K_tileᵀ`, `term2 = Q_proj · Signsᵀ`;
//! 3. `score = scale · term1 + R_norm · (scale · √(π/2)/m) · term2` (the kernel's
//!    `correction_scale` is `scale · √(π/2)/m`), or `scale · term1` without QJL; keys past the
//!    row's causal end are masked;
//! 4. decompress the V tile: `‖v_j‖ · Πᵀ c[idx_j]` (lookup, un-rotate, scale by the norm);
//! 5. online softmax: the block's `(max, Σ exp, Σ exp · v)` is merged into the row's
//!    [`SoftmaxState`] (the kernel's `m_new = max(m_prev, max(scores))`, `acc · exp(m_prev - m_new)`).
//!
//! With `defer_value_unrotation`, step 4 skips `Πᵀ` and the finished row is un-rotated once
//! instead (`Σ p_j Πᵀ y_j = Πᵀ Σ p_j y_j`): one `d x d` product per query row instead of one per
//! key, the same result up to `f32` rounding. The kernel write-up un-rotates per block; a CUDA
//! port may take either.
//!
//! Arithmetic is `f32` with `exp` (the kernel uses `exp2` of `log2(e)`-scaled scores and fp16
//! tensor-core operands; the emulation keeps `Π`, `S` and centroids in `f32` and rounds only the
//! stored norms to f16).

use super::quant::{sketch_seed, MseQuantizer, ProdCode, ProdQuantizer, QjlSketch};
use super::rotation::Rotation;
use super::TurboQuantConfig;
use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, DType, Provenance, SoftmaxState, Tensor,
};
use rayon::prelude::*;
use std::sync::Arc;

/// The quantizers of one layer: keys with `TurboQuant_prod` (or `TurboQuant_mse` without QJL),
/// values with `TurboQuant_mse`.
#[derive(Clone, Debug)]
pub struct TurboQuantCodec {
    /// Key quantizer: `key_bits - 1` MSE bits + 1 QJL bit; without QJL its MSE stage holds all
    /// `key_bits` bits and its sketch is never used (no signs, `‖r‖ = 0` in the cache).
    pub key: ProdQuantizer,
    /// Value quantizer (`value_bits` MSE bits).
    pub value: MseQuantizer,
    /// Keys carry the QJL correction ([`TurboQuantConfig::key_qjl`]).
    pub key_qjl: bool,
}

/// A compressed KV cache, in the fused kernel's operand layout (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct CompressedKv {
    /// Sequences.
    pub batch: usize,
    /// Padded key extent.
    pub max_seqlen_k: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Key head dim.
    pub head_dim_k: usize,
    /// Value head dim.
    pub head_dim_v: usize,
    /// QJL sketch rows `m`.
    pub qjl_dim: usize,
    /// Valid tokens per sequence; rows past them are zero.
    pub seqlens_k: Vec<usize>,
    /// `[B, Sk, Hk, Dk]` key MSE indices.
    pub k_idx: Vec<u8>,
    /// `[B, Sk, Hk]` key norms (f16 values).
    pub k_norm: Vec<f32>,
    /// `[B, Sk, Hk, m/8]` packed QJL signs of the key residuals.
    pub k_signs: Vec<u8>,
    /// `[B, Sk, Hk]` key residual norms `‖k - k_mse‖` (f16 values).
    pub r_norm: Vec<f32>,
    /// `[B, Sk, Hk, Dv]` value indices.
    pub v_idx: Vec<u8>,
    /// `[B, Sk, Hk]` value norms (f16 values).
    pub v_norm: Vec<f32>,
}

/// One query row of a work item's query tile.
struct QueryRow {
    head: usize,
    row: usize,
    /// `Π q`.
    q_rot: Vec<f32>,
    /// `S q` (`Q_proj`).
    q_proj: Vec<f32>,
    /// Visible keys (causal end, at most the sequence's length).
    end: usize,
    state: SoftmaxState,
}

/// A finished row: head, query index, output, LSE.
pub(super) type RowOut = (usize, usize, Vec<f32>, f32);

/// The `[B, Sq, Hq, Dv]` output (rounded to `p.dtype`) and the `[B, Hq, Sq]` LSE of the finished
/// rows of each sequence; rows no work item produced stay 0 and `-inf`.
pub(super) fn assemble_output(
    p: &AttentionProblem,
    tiles: Vec<(usize, Vec<RowOut>)>,
) -> AttentionOutput {
    let (sq, hq) = (p.max_seqlen_q, p.heads_q);
    let mut o = Tensor::zeros(&[p.batch, sq, hq, p.head_dim_v], p.dtype);
    let mut lse = Tensor {
        shape: vec![p.batch, hq, sq],
        dtype: DType::F32,
        data: vec![f32::NEG_INFINITY; p.batch * hq * sq],
    };
    for (b, rows) in tiles {
        for (h, i, orow, l) in rows {
            for (dst, &v) in o.row4_mut(b, i, h).iter_mut().zip(&orow) {
                *dst = p.dtype.round(v);
            }
            lse.data[(b * hq + h) * sq + i] = l;
        }
    }
    AttentionOutput {
        o,
        lse,
        provenance: Provenance::cpu(),
    }
}

impl CompressedKv {
    fn row(&self, b: usize, j: usize, h: usize) -> usize {
        (b * self.max_seqlen_k + j) * self.heads_kv + h
    }
}

impl TurboQuantCodec {
    /// The quantizers a config implies for key dim `dk` and value dim `dv`. The rotation is one
    /// matrix per head dim drawn from `cfg.seed`; keys and values share it when `dk == dv`.
    ///
    /// A building block below the checked entry points ([`super::emulate`], the CUDA backend):
    /// it panics on a configuration [`TurboQuantConfig::check`] refuses for these dims (bits
    /// past the codebooks, a head dim below 3, `qjl_dim` 0), so check the config first.
    pub fn new(cfg: &TurboQuantConfig, dk: usize, dv: usize) -> TurboQuantCodec {
        let key = if cfg.key_qjl {
            ProdQuantizer::new(dk, cfg.key_bits, cfg.qjl_dim, cfg.seed)
        } else {
            // same Π (seeded by (seed, d)) and sketch seed; only the codebook is one bit wider
            ProdQuantizer::from_parts(
                MseQuantizer::new(dk, cfg.key_bits, cfg.seed),
                QjlSketch::new(dk, cfg.qjl_dim, sketch_seed(cfg.seed, dk, cfg.qjl_dim)),
            )
        };
        let value = if dv == dk {
            MseQuantizer::from_parts(
                key.mse().rotation().clone(),
                super::codebook::codebook(cfg.value_bits, dv),
            )
        } else {
            MseQuantizer::new(dv, cfg.value_bits, cfg.seed)
        };
        TurboQuantCodec {
            key,
            value,
            key_qjl: cfg.key_qjl,
        }
    }

    /// Key code of one row: the prod code with QJL, else the MSE code with no signs and `‖r‖ = 0`.
    fn quantize_key(&self, k: &[f32]) -> ProdCode {
        if self.key_qjl {
            return self.key.quantize(k);
        }
        let c = self.key.mse().quantize(k);
        ProdCode {
            norm: c.norm,
            idx: c.idx,
            signs: vec![0; self.key.qjl().sign_bytes()],
            r_norm: 0.0,
        }
    }

    /// The key-side rotation `Π_k`.
    pub fn key_rotation(&self) -> &Arc<Rotation> {
        self.key.mse().rotation()
    }

    /// The value-side rotation `Π_v` (the kernel's resident `Pi`).
    pub fn value_rotation(&self) -> &Arc<Rotation> {
        self.value.rotation()
    }

    /// The QJL sketch `S`.
    pub fn sketch(&self) -> &QjlSketch {
        self.key.qjl()
    }

    /// Compresses the valid K and V rows of `x` (the "compress" kernels). Norms are stored as f16.
    pub fn compress(&self, p: &AttentionProblem, x: &AttentionInputs) -> CompressedKv {
        let (b_, sk, hk, dk, dv) = (
            p.batch,
            p.max_seqlen_k,
            p.heads_kv,
            p.head_dim_qk,
            p.head_dim_v,
        );
        let m = self.key.qjl().rows();
        let sb = self.key.qjl().sign_bytes();
        let rows = b_ * sk * hk;
        let codes: Vec<_> = (0..rows)
            .into_par_iter()
            .map(|r| {
                let (b, j, h) = (r / (sk * hk), (r / hk) % sk, r % hk);
                if j >= p.seqlens_k[b] {
                    return None;
                }
                let kc = self.quantize_key(&x.k.row4(b, j, h)[..dk]);
                let vc = self.value.quantize(x.v_row(p, b, j, h));
                Some((kc, vc))
            })
            .collect();
        let f16 = |v: f32| DType::F16.round(v);
        let mut kv = CompressedKv {
            batch: b_,
            max_seqlen_k: sk,
            heads_kv: hk,
            head_dim_k: dk,
            head_dim_v: dv,
            qjl_dim: m,
            seqlens_k: p.seqlens_k.clone(),
            k_idx: vec![0; rows * dk],
            k_norm: vec![0.0; rows],
            k_signs: vec![0; rows * sb],
            r_norm: vec![0.0; rows],
            v_idx: vec![0; rows * dv],
            v_norm: vec![0.0; rows],
        };
        for (r, c) in codes.into_iter().enumerate() {
            if let Some((kc, vc)) = c {
                kv.k_idx[r * dk..(r + 1) * dk].copy_from_slice(&kc.idx);
                kv.k_norm[r] = f16(kc.norm);
                kv.k_signs[r * sb..(r + 1) * sb].copy_from_slice(&kc.signs);
                kv.r_norm[r] = f16(kc.r_norm);
                kv.v_idx[r * dv..(r + 1) * dv].copy_from_slice(&vc.idx);
                kv.v_norm[r] = f16(vc.norm);
            }
        }
        kv
    }

    /// Dense `K̂ [B, Sk, Hk, Dk]` and `V̂ [B, Sk, Hk, Dv]` (f32) whose exact attention equals
    /// [`Self::attend`] up to rounding: `K̂ = k_mse + ‖r‖ √(π/2)/m Sᵀ signs` (its inner product
    /// with any query is the prod estimate) and `V̂ = ‖v‖ Πᵀ c[idx]`. For tests and inspection.
    pub fn dequantize(&self, kv: &CompressedKv) -> (Tensor, Tensor) {
        let (b_, sk, hk, dk, dv) = (
            kv.batch,
            kv.max_seqlen_k,
            kv.heads_kv,
            kv.head_dim_k,
            kv.head_dim_v,
        );
        let sb = self.key.qjl().sign_bytes();
        let mut k = Tensor::zeros(&[b_, sk, hk, dk], DType::F32);
        let mut v = Tensor::zeros(&[b_, sk, hk, dv], DType::F32);
        let mut rot = vec![0.0f32; dk.max(dv)];
        for b in 0..b_ {
            for j in 0..kv.seqlens_k[b] {
                for h in 0..hk {
                    let r = kv.row(b, j, h);
                    let kr = k.row4_mut(b, j, h);
                    if self.key.mse().bits() > 0 {
                        self.key.mse().dequantize_rotated(
                            kv.k_norm[r],
                            &kv.k_idx[r * dk..(r + 1) * dk],
                            &mut rot[..dk],
                        );
                        self.key_rotation().apply_t(&rot[..dk], kr);
                    }
                    if self.key_qjl {
                        self.key.qjl().add_dequantized(
                            &kv.k_signs[r * sb..(r + 1) * sb],
                            kv.r_norm[r],
                            kr,
                        );
                    }
                    self.value.dequantize_rotated(
                        kv.v_norm[r],
                        &kv.v_idx[r * dv..(r + 1) * dv],
                        &mut rot[..dv],
                    );
                    self.value_rotation()
                        .apply_t(&rot[..dv], v.row4_mut(b, j, h));
                }
            }
        }
        (k, v)
    }

    /// Attention of `q [B, Sq, Hq, Dk]` over the compressed cache, block by block as the fused
    /// kernel does (module docs). `p` must describe `q` and the cache.
    pub fn attend(
        &self,
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
        q: &Tensor,
        kv: &CompressedKv,
    ) -> AttentionOutput {
        let (hk, dk, dv) = (p.heads_kv, p.head_dim_qk, p.head_dim_v);
        let group = p.group_size();
        let m = self.key.qjl().rows();
        let sb = self.key.qjl().sign_bytes();
        let key_mse = self.key.mse().bits() > 0;
        let scale = p.softmax_scale;
        let correction_scale = scale * self.key.qjl().correction_scale();
        let bk = cfg.block_k.max(1);
        let pi_v = self.value_rotation();

        // one work item per (sequence, KV head): its query tile is all rows of the group's heads
        let tiles: Vec<(usize, Vec<RowOut>)> = (0..p.batch * hk)
            .into_par_iter()
            .map(|t| {
                let (b, g) = (t / hk, t % hk);
                let sk = kv.seqlens_k[b];
                let mut rows: Vec<QueryRow> = Vec::new();
                for h in g * group..(g + 1) * group {
                    for i in 0..p.seqlens_q[b] {
                        let prep = self.key.prepare_query(q.row4(b, i, h));
                        let end = p.visible_keys(b, i).min(sk);
                        rows.push(QueryRow {
                            head: h,
                            row: i,
                            q_rot: prep.rot,
                            q_proj: prep.proj,
                            end,
                            state: SoftmaxState::empty(dv),
                        });
                    }
                }
                let mut k_tile = vec![0.0f32; bk * dk];
                let mut s_tile = vec![0.0f32; bk * m];
                let mut v_tile = vec![0.0f32; bk * dv];
                let mut v_rot = vec![0.0f32; dv];
                let mut scores = vec![0.0f32; bk];
                let last_end = rows.iter().map(|r| r.end).max().unwrap_or(0);
                let mut start = 0;
                while start < last_end {
                    let n = bk.min(sk - start);
                    // 1. decompress the K tile (rotated domain) and the sign tile
                    for jj in 0..n {
                        let r = kv.row(b, start + jj, g);
                        if key_mse {
                            self.key.mse().dequantize_rotated(
                                kv.k_norm[r],
                                &kv.k_idx[r * dk..(r + 1) * dk],
                                &mut k_tile[jj * dk..(jj + 1) * dk],
                            );
                        }
                        if self.key_qjl {
                            self.key.qjl().unpack_signs(
                                &kv.k_signs[r * sb..(r + 1) * sb],
                                &mut s_tile[jj * m..(jj + 1) * m],
                            );
                        }
                    }
                    // 4. decompress the V tile: lookup, un-rotate (unless deferred), scale by the norm
                    for jj in 0..n {
                        let r = kv.row(b, start + jj, g);
                        let out = &mut v_tile[jj * dv..(jj + 1) * dv];
                        if cfg.defer_value_unrotation {
                            self.value.dequantize_rotated(
                                kv.v_norm[r],
                                &kv.v_idx[r * dv..(r + 1) * dv],
                                out,
                            );
                        } else {
                            self.value.dequantize_rotated(
                                1.0,
                                &kv.v_idx[r * dv..(r + 1) * dv],
                                &mut v_rot,
                            );
                            pi_v.apply_t(&v_rot, out);
                            let vn = kv.v_norm[r];
                            out.iter_mut().for_each(|x| *x *= vn);
                        }
                    }
                    for qrow in rows.iter_mut() {
                        let vis = qrow.end.min(start + n).saturating_sub(start);
                        if vis == 0 {
                            continue;
                        }
                        // 2-3. scores of the visible keys of the block
                        let mut mb = f32::NEG_INFINITY;
                        for jj in 0..vis {
                            let r = kv.row(b, start + jj, g);
                            let term1: f32 = if key_mse {
                                qrow.q_rot
                                    .iter()
                                    .zip(&k_tile[jj * dk..(jj + 1) * dk])
                                    .map(|(a, c)| a * c)
                                    .sum()
                            } else {
                                0.0
                            };
                            let s = if self.key_qjl {
                                let term2: f32 = qrow
                                    .q_proj
                                    .iter()
                                    .zip(&s_tile[jj * m..(jj + 1) * m])
                                    .map(|(a, c)| a * c)
                                    .sum();
                                term1 * scale + kv.r_norm[r] * correction_scale * term2
                            } else {
                                term1 * scale
                            };
                            scores[jj] = s;
                            mb = mb.max(s);
                        }
                        // 5. the block's softmax state, merged into the row's running state
                        let mut block = SoftmaxState::empty(dv);
                        block.m = mb;
                        for jj in 0..vis {
                            let pj = (scores[jj] - mb).exp();
                            block.l += pj;
                            for (a, &vv) in
                                block.acc.iter_mut().zip(&v_tile[jj * dv..(jj + 1) * dv])
                            {
                                *a += pj * vv;
                            }
                        }
                        qrow.state.merge(&block);
                    }
                    start += n;
                }
                let out = rows
                    .into_iter()
                    .map(|qrow| {
                        let (mut o, lse) = qrow.state.finish();
                        if cfg.defer_value_unrotation && lse != f32::NEG_INFINITY {
                            let mut un = vec![0.0f32; dv];
                            pi_v.apply_t(&o, &mut un);
                            o = un;
                        }
                        (qrow.head, qrow.row, o, lse)
                    })
                    .collect();
                (b, out)
            })
            .collect();
        assemble_output(p, tiles)
    }
}
