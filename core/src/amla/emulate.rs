//! CPU emulation of AMLA Algorithm 2, of the section 5.1 "Base" (Algorithm 1 in mixed precision)
//! and of the naive Eq. 3 rescaling, each computed the way the kernel computes it.
//!
//! Every variant shares the Cube stages as Ascend runs them: `[C1]` multiplies BF16 Q by BF16 K
//! and accumulates in FP32 (L0C), `[C2]` multiplies a BF16 P by BF16 V and accumulates in FP32.
//! The variants differ only in the Vector stage `[V1]` (what P is scaled by before its BF16 cast)
//! and in how the running FP32 output O is rescaled between KV blocks:
//!
//! * [`Rescaling::Amla`]: Algorithm 2. O lives in global memory; its rescale by
//!   `2^(n_i - n_{i-1})` (times the Appendix A correction `c_i / c_{i-1}`) is one
//!   `AtomicAdd<INT32>` on its bit pattern (Lemma 3.1, Eq. 8/9), the block product is then added
//!   with `AtomicAdd<FP32>`.
//! * [`Rescaling::Base`]: Algorithm 1, with `O <- O * exp(m_{i-1} - m_i) + T` as an FP32 multiply.
//! * [`Rescaling::NaiveEq3`]: Eq. 3, `O^ <- O^ + exp(m_i) P_i V_i`, which overflows FP32 as soon
//!   as `m_i > 88.72` (section 3.1, "Naive Optimization and Its Pitfall").
//!
//! Rows are independent in every variant, so the emulation runs one rayon task per batch entry
//! and group of heads; a task walks the KV blocks of the plan's `block_k` and advances the
//! online-softmax state of each of its rows (heads x query tokens, 1 or 2 with MTP) through
//! each block, as the `G` rows of a Cube tile share each KV block on the device. Ragged
//! `seqlens_k`, the causal mask (bottom-right aligned, as MTP needs) and empty rows (O = 0,
//! LSE = -inf) follow [`AttentionProblem::visible_keys`].
//!
//! Why line 11 is read as `c_i = S16 / S32`: line 9 gives `S32 = 2^{n_i} e^{m_i} = 1/r_i` and
//! line 10 `S16 = (1/r_i)_BF16 = 1/r'_i`; Appendix A defines `c_i = r_i / r'_i = S16 / S32` and
//! derives the recurrence `O_bar_i = O_bar_{i-1} 2^{n_i - n_{i-1}} c_i / c_{i-1} + (P_i S16)_BF16 V_i`
//! (Eq. 13), whose end value `O_bar_N = S16_N O_N` is exactly what line 22 divides by
//! `l_N S16_N`. Line 11 as printed (`c_i = S32 / S16`) inverts the correction;
//! [`Compensation::Line11AsPrinted`] keeps it for comparison.

use super::AmlaPlan;
use crate::dtype::to_bf16;
use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, CoreError, DType, KvLayout, Provenance,
    Result, Tensor,
};
use rayon::prelude::*;
use std::f32::consts::LN_2;

/// `2^23`: one unit of the FP32 exponent field seen as an INT32 (Eq. 6).
pub const EXPONENT_UNIT: i32 = 1 << 23;

/// How the running output is rescaled between KV blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rescaling {
    /// AMLA Algorithm 2: INT32 addition on the FP32 bit pattern of O, with the given compensation.
    Amla(Compensation),
    /// Section 5.1 "Base": Algorithm 1 in mixed precision, FP32 rescale by multiplication.
    Base,
    /// Eq. 3: `O^_i = O^_{i-1} + exp(m_i) P_i V_i`; overflows when `m_i > 88`.
    NaiveEq3,
}

/// The error compensation of Appendix A.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compensation {
    /// No compensation: `epsilon = 0` on line 13 (the uncompensated Eq. 11 with
    /// pre-multiplication scaling, i.e. `(P_i S16)_BF16`).
    Off,
    /// Appendix A, Eq. 12-13: `c_i = r_i / r'_i`, which in Algorithm 2's names is
    /// `S16 / S32` (since `S32 = 1/r_i` and `S16 = (1/r_i)_BF16 = 1/r'_i`).
    AppendixA,
    /// Line 11 of Algorithm 2 exactly as printed, `c_i = S32 / S16`: the reciprocal of
    /// Appendix A's `c_i`. It applies the correction with the wrong sign and so doubles the
    /// error it is meant to remove; kept so a test can show which reading is right.
    Line11AsPrinted,
}

/// Multiplies `x` by `2^k` the AMLA way: `AS_FP32(AS_INT32(x) + k * 2^23)` (Lemma 3.1, Eq. 8).
///
/// Exact for every normal `x` (either sign) as long as the result stays normal; see
/// [`int32_add_on_bits`] for zero, subnormals and under/overflow.
pub fn mul_pow2_by_int_add(x: f32, k: i32) -> f32 {
    int32_add_on_bits(x, k.saturating_mul(EXPONENT_UNIT))
}

/// `AtomicAdd<INT32>` of `delta` on the bit pattern of the FP32 value `x` (Algorithm 2 lines
/// 16-17), guarded where Lemma 3.1's hypothesis `0 < E + n < 255` fails.
///
/// FP32 is sign-magnitude, so for a normal `x` of either sign adding `delta` to the signed INT32
/// `I = -2^31 S + 2^23 E + M` (Eq. 6) adds it to the magnitude bits `2^23 E + M` and leaves the
/// sign alone: a negative O entry is scaled exactly like a positive one. Outside the lemma's
/// range the raw hardware addition produces garbage (see [`int32_add_raw`]: `+0.0` plus
/// `-2^23` is the bit pattern of `-inf`, `-0.0` plus `-2^23` is `+inf`). Real kernels never meet
/// those cases on typical data, but an O entry can be exactly zero (a V column of zeros, an exact
/// cancellation), so the emulation handles them as an exact multiplication would:
///
/// * `x = ±0` or subnormal (`E = 0`): returns `±0` (zero stays zero; subnormals, below
///   `1.2e-38` and neglected by the paper's Eq. 5, are flushed);
/// * the new exponent field would be `<= 0`: underflow, returns `±0`;
/// * the new exponent field would be `>= 255`: overflow, returns `±inf` (never reached by
///   AMLA: `n_i` is non-increasing, so `delta <= 1.5 * 2^23 * |c_i/c_{i-1} - 1| < 2^23`);
/// * `x` infinite or NaN: returned unchanged.
///
/// Within the lemma's range the result is bit-identical to [`int32_add_raw`].
pub fn int32_add_on_bits(x: f32, delta: i32) -> f32 {
    let bits = x.to_bits();
    let sign = bits & 0x8000_0000;
    let mag = bits & 0x7fff_ffff;
    if mag < 0x0080_0000 {
        return f32::from_bits(sign);
    }
    if mag >= 0x7f80_0000 {
        return x;
    }
    let new = mag as i64 + delta as i64;
    if new < 0x0080_0000 {
        f32::from_bits(sign)
    } else if new >= 0x7f80_0000 {
        f32::from_bits(sign | 0x7f80_0000)
    } else {
        f32::from_bits(sign | new as u32)
    }
}

/// The unguarded hardware operation: `AS_FP32(AS_INT32(x) + delta)` with wrapping INT32
/// addition. Only for tests and demonstrations of why the guard in [`int32_add_on_bits`] exists.
pub fn int32_add_raw(x: f32, delta: i32) -> f32 {
    f32::from_bits((x.to_bits() as i32).wrapping_add(delta) as u32)
}

/// `Cast_to_int32` of Algorithm 2 line 14, taken as round to nearest even (Ascend's
/// `CAST_RINT`). The `+1e-6` of line 13 shifts an exact `-k` by about 8 INT32 units, a bias of
/// `~1e-6` relative per block whichever rounding mode the kernel uses.
fn cast_to_int32(x: f32) -> i32 {
    x.round_ties_even() as i32
}

/// FP32 dot product of two BF16-valued rows, as a Cube MMAD accumulates it in L0C. The
/// summation order (8 interleaved partial sums) is not specified by the paper; any order gives
/// FP32 rounding far below the BF16 effects studied here.
#[inline]
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        let (x, y): (&[f32; 8], &[f32; 8]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for ((a, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *a += x * y;
        }
    }
    let mut tail = 0.0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `t += w * v` in FP32 (one rank-1 step of the `[C2]` MMAD). A zero weight (a probability
/// that underflowed, common when one key dominates) is skipped: adding `+0 * v = ±0` to an
/// accumulator that started at `+0` leaves it bit-identical, so skipping is exact.
#[inline]
fn axpy(t: &mut [f32], w: f32, v: &[f32]) {
    if w == 0.0 {
        return;
    }
    for (a, &x) in t.iter_mut().zip(v) {
        *a += w * x;
    }
}

/// Heads one rayon task takes: they share every KV block while it is hot in cache, as the
/// `G` rows of a Cube tile share it on the device (the numerics do not depend on this).
const HEADS_PER_TASK: usize = 8;

/// The running state of one query row: Algorithm 2 line 3 (and Algorithm 1 line 3).
struct RowState {
    /// KV blocks processed so far (`i - 1` in the paper's 1-based loop).
    blocks_done: usize,
    /// `m_{i-1}`: running maximum of the scaled logits (`-inf` before the first block).
    m: f32,
    /// `l_{i-1}`: running sum of `exp(S - m)` (Algorithm 1/2 line 8).
    l: f32,
    /// `n_{i-1}` (AMLA). `n_0 = -inf` is never read: line 15 skips the rescale for i = 1.
    n_prev: i32,
    /// `c_{i-1}` (AMLA), `c_0 = 1`.
    c_prev: f32,
    /// `S16` of the last block (AMLA; line 22 divides by it).
    s16: f32,
    /// `l^` of Eq. 3 (sum of `exp(S)`).
    l_hat: f32,
    /// The running O (FP32; in GM on the device), `O = 0` initially.
    o: Vec<f32>,
}

impl RowState {
    fn new(dv: usize) -> RowState {
        RowState {
            blocks_done: 0,
            m: f32::NEG_INFINITY,
            l: 0.0,
            n_prev: 0,
            c_prev: 1.0,
            s16: 1.0,
            l_hat: 0.0,
            o: vec![0.0; dv],
        }
    }

    /// One iteration of the loop over KV blocks (Algorithm 2 lines 7-20, Algorithm 1 lines
    /// 7-9) after `[C1]`: `s` holds the block's scaled FP32 scores `S_i / sqrt(D_k)` of keys
    /// `start..start + s.len()` (it is overwritten with P); `kv` holds the latent rows `[Sk, dqk]`
    /// whose first `dv` columns are V, already BF16; `t` is scratch of `dv` floats.
    fn step(
        &mut self,
        s: &mut [f32],
        kv: &[f32],
        dqk: usize,
        start: usize,
        rescaling: Rescaling,
        t: &mut [f32],
    ) {
        let dv = self.o.len();
        let stop = start + s.len();
        let v_row = |j: usize| &kv[j * dqk..j * dqk + dv];
        let o = &mut self.o;
        // line 7: m_i = max(m_{i-1}, rowmax(S_i)), M_up = exp(m_{i-1} - m_i)
        let m_new = s.iter().copied().fold(self.m, f32::max);
        // (M_up = exp(-inf) = 0 on the first block)
        let m_up = (self.m - m_new).exp();
        // line 8: P_i = exp(S_i - m_i) (FP32), rowsum(P_i)
        let mut rowsum = 0.0f32;
        for sj in s.iter_mut() {
            *sj = (*sj - m_new).exp();
            rowsum += *sj;
        }
        t.fill(0.0);
        match rescaling {
            Rescaling::Amla(comp) => {
                // line 8: l_i = l_{i-1} M_up + rowsum(P_i)
                self.l = self.l * m_up + rowsum;
                // line 8: n_i = round(-m_i / ln 2), so that 2^{n_i} ~ exp(-m_i) and
                // r_i = exp(-n_i ln 2 - m_i) lies in [1/sqrt 2, sqrt 2] (Eq. 4).
                let n = (-m_new / LN_2).round() as i32;
                // line 9: S32 = exp(ln 2 (n_i + m_i / ln 2)) = 2^{n_i} e^{m_i} = 1 / r_i
                let s32 = (LN_2 * (n as f32 + m_new / LN_2)).exp();
                // line 10: S16 = Cast_to_BF16(S32), back to FP32 (= 1 / r'_i of Appendix A)
                let s16 = to_bf16(s32);
                // line 11: c_i and epsilon = 1.5 (c_i / c_{i-1} - 1) (Appendix A: the INT32
                // image of a multiply by 1 + e is about +1.5 * 2^23 e, taking M ~ 2^22).
                let c = match comp {
                    Compensation::Off => 1.0,
                    Compensation::AppendixA => s16 / s32,
                    Compensation::Line11AsPrinted => s32 / s16,
                };
                let eps = 1.5 * (c / self.c_prev - 1.0);
                // line 12: P_i = P_i * S16, then cast to BF16 (the [C2] input)
                for sj in s.iter_mut() {
                    *sj = to_bf16(*sj * s16);
                }
                // line 13: N = max(n_i - n_{i-1}, -30) + epsilon + 1e-6;
                // line 14: N = Cast_to_int32(N * 2^23)
                // lines 15-18: if i > 1, O = AS_FP32(AS_INT32(O) + N)  (AtomicAdd<INT32> in GM)
                if self.blocks_done > 0 {
                    let nf = (n - self.n_prev).max(-30) as f32 + eps + 1e-6;
                    let delta = cast_to_int32(nf * EXPONENT_UNIT as f32);
                    for ov in o.iter_mut() {
                        *ov = int32_add_on_bits(*ov, delta);
                    }
                }
                // line 19: O_i = P_i V_i ([C2], BF16 inputs, FP32 accumulation in L0C)
                for (&pj, j) in s.iter().zip(start..stop) {
                    axpy(t, pj, v_row(j));
                }
                // line 20: O = O + O_i  (AtomicAdd<FP32> in GM)
                for (ov, &tv) in o.iter_mut().zip(t.iter()) {
                    *ov += tv;
                }
                self.n_prev = n;
                self.c_prev = c;
                self.s16 = s16;
            }
            Rescaling::Base => {
                // Algorithm 1 line 7: l_i = l_{i-1} exp(m_{i-1} - m_i) + rowsum(P_i)
                self.l = self.l * m_up + rowsum;
                // Algorithm 1 line 8: T_i = P_i V_i, with P_i cast to BF16 for the Cube
                for (&pj, j) in s.iter().zip(start..stop) {
                    axpy(t, to_bf16(pj), v_row(j));
                }
                // Algorithm 1 line 9: O_i = O_{i-1} exp(m_{i-1} - m_i) + T_i (FP32 multiply)
                for (ov, &tv) in o.iter_mut().zip(t.iter()) {
                    *ov = *ov * m_up + tv;
                }
            }
            Rescaling::NaiveEq3 => {
                // Eq. 3: O^_i = O^_{i-1} + exp(m_i) P_i V_i, l^_i = l^_{i-1} + exp(m_i) rowsum(P_i).
                // exp(m_i) is +inf in FP32 once m_i > 88.72.
                let e = m_new.exp();
                self.l_hat += e * rowsum;
                for (&pj, j) in s.iter().zip(start..stop) {
                    axpy(t, to_bf16(e * pj), v_row(j));
                }
                for (ov, &tv) in o.iter_mut().zip(t.iter()) {
                    *ov += tv;
                }
            }
        }
        self.m = m_new;
        self.blocks_done += 1;
    }

    /// The final normalisation; writes O (FP32) to `out` and returns the LSE.
    fn finish(self, rescaling: Rescaling, out: &mut [f32]) -> f32 {
        let (denom, lse) = match rescaling {
            // Algorithm 2 line 22: O = O / (l_N S16)
            Rescaling::Amla(_) => (self.l * self.s16, self.m + self.l.ln()),
            // Algorithm 1 line 11: O = O_N / l_N
            Rescaling::Base => (self.l, self.m + self.l.ln()),
            // Eq. 3: O = O^ / l^
            Rescaling::NaiveEq3 => (self.l_hat, self.l_hat.ln()),
        };
        for (dst, &ov) in out.iter_mut().zip(&self.o) {
            *dst = ov / denom;
        }
        lse
    }
}

/// Checks that `x` holds the tensors `p` describes (MLA latent layout).
fn check_inputs(p: &AttentionProblem, x: &AttentionInputs) -> Result<()> {
    if p.kv_layout != KvLayout::MlaLatent || x.v.is_some() {
        return Err(CoreError::Unsupported {
            what: format!(
                "AMLA emulation of kv_layout {:?} with {} V tensor",
                p.kv_layout,
                if x.v.is_some() { "a separate" } else { "no" }
            ),
            supported: "MLA latent kv [B, Sk, 1, Dqk] whose first Dv columns are V (no separate v)"
                .into(),
        });
    }
    let want_q = [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk];
    if x.q.shape != want_q {
        return Err(CoreError::Shape {
            tensor: "q",
            actual: x.q.shape.clone(),
            expected: format!("{want_q:?} as the problem says"),
        });
    }
    let want_kv = [p.batch, p.max_seqlen_k, 1, p.head_dim_qk];
    if x.k.shape != want_kv {
        return Err(CoreError::Shape {
            tensor: "kv",
            actual: x.k.shape.clone(),
            expected: format!("{want_kv:?} as the problem says"),
        });
    }
    x.q.check_data("q")?;
    x.k.check_data("kv")
}

/// Runs emulated kernels over the same inputs and returns, for each of `variants`, O in FP32
/// before its cast to the output dtype (`[B, Sq, Hq, Dv]`) and the LSE (`[B, Hq, Sq]`). The
/// `[C1]` scores are computed once and shared: they are the same in every variant, so each
/// result is bit-identical to a run of that variant alone.
pub(crate) fn run_f32_multi(
    p: &AttentionProblem,
    x: &AttentionInputs,
    block_k: usize,
    variants: &[Rescaling],
) -> Result<Vec<(Vec<f32>, Vec<f32>)>> {
    p.validate()?;
    check_inputs(p, x)?;
    if block_k == 0 {
        return Err(CoreError::InvalidPlan(
            "AMLA block_k is 0; it must be at least 1".into(),
        ));
    }
    let (sq, sk, hq, dqk, dv) = (
        p.max_seqlen_q,
        p.max_seqlen_k,
        p.heads_q,
        p.head_dim_qk,
        p.head_dim_v,
    );
    // The Cube stages read BF16: cast Q and the latent KV (K and V) once.
    let q_bf: Vec<f32> = x.q.data.par_iter().map(|&v| to_bf16(v)).collect();
    let kv_bf: Vec<f32> = x.k.data.par_iter().map(|&v| to_bf16(v)).collect();
    let scale = p.softmax_scale;
    let nv = variants.len();
    let chunks = hq.div_ceil(HEADS_PER_TASK);
    // One task per (batch, group of heads); rows are independent, so this changes no number.
    type RowOut = (usize, usize, usize, Vec<(Vec<f32>, f32)>);
    let per_task: Vec<Vec<RowOut>> = (0..p.batch * chunks)
        .into_par_iter()
        .map(|task| {
            let (b, h0) = (task / chunks, (task % chunks) * HEADS_PER_TASK);
            let kv = &kv_bf[b * sk * dqk..(b + 1) * sk * dqk];
            // (h, i, keys seen, one state per variant) for every row of the group that sees at
            // least one key; rows with no key keep O = 0 and LSE = -inf
            let mut rows: Vec<(usize, usize, usize, Vec<RowState>)> = Vec::new();
            for h in h0..(h0 + HEADS_PER_TASK).min(hq) {
                for i in 0..p.seqlens_q[b] {
                    let end = p.visible_keys(b, i);
                    if end > 0 {
                        rows.push((h, i, end, (0..nv).map(|_| RowState::new(dv)).collect()));
                    }
                }
            }
            let max_end = rows.iter().map(|r| r.2).max().unwrap_or(0);
            let mut scores = vec![0.0f32; block_k.min(sk.max(1))];
            let mut work = scores.clone();
            let mut t = vec![0.0f32; dv];
            // lines 4-5: the KV blocks, each shared by every row of the group
            for start in (0..max_end).step_by(block_k) {
                for (h, i, end, states) in rows.iter_mut() {
                    if start >= *end {
                        continue;
                    }
                    let stop = (start + block_k).min(*end);
                    let q = &q_bf[((b * sq + *i) * hq + *h) * dqk..][..dqk];
                    // line 6: S_i = Q K_i^T ([C1], BF16 inputs, FP32 accumulation);
                    // line 7: S_i = S_i / sqrt(D_k) (the problem's softmax_scale), in FP32.
                    // Identical for every variant, so computed once.
                    let s = &mut scores[..stop - start];
                    for (sj, j) in s.iter_mut().zip(start..stop) {
                        *sj = dot_f32(q, &kv[j * dqk..(j + 1) * dqk]) * scale;
                    }
                    for (st, &r) in states.iter_mut().zip(variants) {
                        let w = &mut work[..stop - start];
                        w.copy_from_slice(s);
                        st.step(w, kv, dqk, start, r, &mut t);
                    }
                }
            }
            rows.into_iter()
                .map(|(h, i, _, states)| {
                    let outs = states
                        .into_iter()
                        .zip(variants)
                        .map(|(st, &r)| {
                            let mut out = vec![0.0f32; dv];
                            let lse = st.finish(r, &mut out);
                            (out, lse)
                        })
                        .collect();
                    (b, h, i, outs)
                })
                .collect()
        })
        .collect();
    let mut res: Vec<(Vec<f32>, Vec<f32>)> = (0..nv)
        .map(|_| {
            (
                vec![0.0f32; p.batch * sq * hq * dv],
                vec![f32::NEG_INFINITY; p.batch * hq * sq],
            )
        })
        .collect();
    for (b, h, i, outs) in per_task.into_iter().flatten() {
        let dst = ((b * sq + i) * hq + h) * dv;
        for ((o, lse), (orow, l)) in res.iter_mut().zip(outs) {
            o[dst..dst + dv].copy_from_slice(&orow);
            lse[(b * hq + h) * sq + i] = l;
        }
    }
    Ok(res)
}

/// [`run_f32_multi`] for one variant.
pub(crate) fn run_f32(
    p: &AttentionProblem,
    x: &AttentionInputs,
    block_k: usize,
    rescaling: Rescaling,
) -> Result<(Vec<f32>, Vec<f32>)> {
    Ok(run_f32_multi(p, x, block_k, &[rescaling])?.remove(0))
}

/// Runs a variant and packages O (cast to the problem's dtype) and LSE.
pub fn emulate_with(
    plan: &AmlaPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
    rescaling: Rescaling,
) -> Result<AttentionOutput> {
    let (o, lse) = run_f32(p, x, plan.block_k, rescaling)?;
    let what = match rescaling {
        Rescaling::Amla(Compensation::AppendixA) => {
            "AMLA Algorithm 2 (with Appendix A compensation)"
        }
        Rescaling::Amla(Compensation::Off) => "AMLA Algorithm 2 (without compensation)",
        Rescaling::Amla(Compensation::Line11AsPrinted) => "AMLA Algorithm 2 (line 11 as printed)",
        Rescaling::Base => "section 5.1 Base (mixed-precision FlashAttention)",
        Rescaling::NaiveEq3 => "naive Eq. 3 rescaling",
    };
    Ok(AttentionOutput {
        o: Tensor {
            shape: vec![p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v],
            dtype: p.dtype,
            data: o.into_iter().map(|v| p.dtype.round(v)).collect(),
        },
        lse: Tensor {
            shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
            dtype: DType::F32,
            data: lse,
        },
        provenance: Provenance {
            simulated: Some(format!("CPU emulation of {what}; no Ascend NPU ran it")),
            ..Provenance::cpu()
        },
    })
}
