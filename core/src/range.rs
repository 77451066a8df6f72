//! The value ranges the `f32` emulations compute correctly, checked before they run.
//!
//! Every finite input a dtype can hold is accepted by [`crate::AttentionInputs::problem`], but an
//! `f32` softmax cannot represent every logit those inputs make: with `|q|, |k| ~ 4e20` a single
//! product `q_c k_c` is `1.6e41`, past `f32::MAX`, the row maximum becomes `inf`, `s - m` becomes
//! NaN and the row silently comes out as O = 0, LSE = `-inf`. The emulations therefore
//!
//! * multiply `q` by the softmax scale *before* the dot product (the logit range is what must fit,
//!   not the range of the unscaled `q . k`), and
//! * refuse, with the supported range in the message, inputs whose logits or sums could still
//!   overflow. The bounds are a priori (Cauchy-Schwarz on row norms taken in `f64`), so a refusal
//!   never depends on summation order, and an accepted input provably stays finite:
//!   - [`check_f32_softmax`] (exact, lean): `scale * max_i ||q_i|| * max_j ||k_j|| <=`
//!     [`MAX_LOGIT`], which keeps `s - m` and `m + ln l` finite, and
//!     `max |v| * max_seqlen_k <= f32::MAX / 2`, which keeps the unnormalised `sum_j p_j v_j`
//!     (each `p_j <= 1`) finite;
//!   - [`check_turboquant`]: in addition, every K and V row norm fits `f16` (the compressed cache
//!     stores `||k||`, `||k - k_mse||` and `||v||` as f16, as the fused kernel's operands do) and
//!     `q` rows stay below [`TURBOQUANT_MAX_Q_NORM`] (rotated and sketched unscaled);
//!   - [`check_amla`]: the bounds AMLA's `2^n` rescaling needs.
//!
//! Accuracy is another matter: an `f32` logit carries a rounding error of about
//! `d * 2^-24 * |logit|`, so logits in the thousands lose digits that the softmax amplifies. That
//! is inherent to every `f32` attention kernel; `ferrattn run` measures the result against the
//! `f64` golden and fails when it misses the stated tolerance.
//!
//! TurboAttention has its own, stricter limit ([`crate::turbo::MAX_MAGNITUDE`]), checked by
//! `turbo::check_inputs`; AMLA's ([`check_amla`]) follows from its `2^n` rescaling.

use crate::{Algorithm, AttentionInputs, AttentionProblem, BackendKind, CoreError, DType, Result};

/// The range check of `algorithm` on `backend`, for the API boundary (`Runtime::run`), so that
/// every backend's kernels, not only the CPU emulations (which also check), are covered:
/// [`check_f32_softmax`] for exact and lean (on CUDA, whose lean kernel scales after the dot
/// product, also `max ||q|| max ||k|| <= f32::MAX / 2`), [`check_amla`], [`check_turboquant`],
/// and TurboAttention's magnitude limit ([`crate::turbo::MAX_MAGNITUDE`]).
pub fn check(
    algorithm: Algorithm,
    backend: BackendKind,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<()> {
    match algorithm {
        Algorithm::Exact | Algorithm::Lean => {
            let r = check_f32_softmax(p, x)?;
            if backend == BackendKind::Cuda && r.q_norm * r.k_norm > f32::MAX as f64 / 2.0 {
                return Err(refuse(
                    format!(
                        "lean on cuda over inputs whose unscaled q . k may reach {:.3e}",
                        r.q_norm * r.k_norm
                    ),
                    "max ||q|| x max ||k|| up to f32::MAX / 2 (the kernel scales after the FP32 dot product)".into(),
                ));
            }
            Ok(())
        }
        Algorithm::Amla => check_amla(p, x).map(|_| ()),
        Algorithm::TurboQuant => check_turboquant(p, x).map(|_| ()),
        Algorithm::Turbo => {
            crate::turbo::check_values("q", &x.q.data)?;
            crate::turbo::check_values("k", &x.k.data)?;
            match &x.v {
                Some(v) => crate::turbo::check_values("v", &v.data),
                None => Ok(()),
            }
        }
    }
}

/// Largest logit bound `scale * max ||q|| * max ||k||` the `f32` softmax accepts: `s - m` stays
/// within `2e37 < f32::MAX` and `m + ln l` within `f32`.
pub const MAX_LOGIT: f64 = 1e37;

/// Row-norm summary of the inputs of one call, in `f64`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputRange {
    /// Largest L2 norm of a `q` row (one token of one head).
    pub q_norm: f64,
    /// Largest L2 norm of a `k` row (MLA: of a latent `kv` row).
    pub k_norm: f64,
    /// Largest L2 norm of a `v` row (MLA: of the first `head_dim_v` columns of `kv`).
    pub v_norm: f64,
    /// Largest `|v|` element.
    pub v_abs: f64,
    /// `softmax_scale * q_norm * k_norm`: no logit of the call is larger in magnitude.
    pub logit_bound: f64,
}

fn max_row_norm(rows: impl Iterator<Item = impl AsRef<[f32]>>) -> (f64, f64) {
    rows.fold((0.0f64, 0.0f64), |(n, a), r| {
        let r = r.as_ref();
        let sq: f64 = r.iter().map(|&x| x as f64 * x as f64).sum();
        let amax = r.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
        (n.max(sq.sqrt()), a.max(amax))
    })
}

impl InputRange {
    /// Measures `x` (whose shapes `p` describes).
    pub fn of(p: &AttentionProblem, x: &AttentionInputs) -> InputRange {
        let (dk, dv) = (p.head_dim_qk, p.head_dim_v);
        let (q_norm, _) = max_row_norm(x.q.data.chunks(dk.max(1)));
        let (k_norm, _) = max_row_norm(x.k.data.chunks(dk.max(1)));
        let (v_norm, v_abs) = match &x.v {
            Some(v) => max_row_norm(v.data.chunks(dv.max(1))),
            None => max_row_norm(x.k.data.chunks(dk.max(1)).map(|r| &r[..dv.min(r.len())])),
        };
        InputRange {
            q_norm,
            k_norm,
            v_norm,
            v_abs,
            logit_bound: p.softmax_scale as f64 * q_norm * k_norm,
        }
    }
}

fn refuse(what: String, supported: String) -> CoreError {
    CoreError::Unsupported { what, supported }
}

/// Refuses inputs whose logits or output sums could overflow the `f32` softmax of the exact and
/// lean emulations (module docs).
pub fn check_f32_softmax(p: &AttentionProblem, x: &AttentionInputs) -> Result<InputRange> {
    let r = InputRange::of(p, x);
    if r.logit_bound > MAX_LOGIT || p.softmax_scale as f64 * r.q_norm > f32::MAX as f64 {
        return Err(refuse(
            format!(
                "inputs whose logits may reach {:.3e} (softmax_scale {} x max row norm of q {:.3e} x of k {:.3e})",
                r.logit_bound, p.softmax_scale, r.q_norm, r.k_norm
            ),
            format!(
                "softmax_scale x max ||q|| x max ||k|| up to {MAX_LOGIT:e}, so the f32 softmax cannot overflow"
            ),
        ));
    }
    let v_limit = f32::MAX as f64 / 2.0 / p.max_seqlen_k.max(1) as f64;
    if r.v_abs > v_limit {
        return Err(refuse(
            format!(
                "v values up to {:.3e} over {} keys",
                r.v_abs, p.max_seqlen_k
            ),
            format!(
                "|v| up to {v_limit:.3e} = f32::MAX / 2 / max_seqlen_k, so the f32 sum of weighted v rows cannot overflow"
            ),
        ));
    }
    Ok(r)
}

/// Largest logit bound AMLA accepts: Algorithm 2 line 8 takes `n_i = round(-m_i / ln 2)` and
/// line 9 `S32 = exp(ln 2 (n_i + m_i / ln 2))`, which needs `m_i / ln 2` to keep its fraction in
/// `f32` (spacing 0.125 at `1e6 / ln 2`), or `r_i` leaves Eq. 4's `[1/sqrt 2, sqrt 2]`.
pub const AMLA_MAX_LOGIT: f64 = 1e6;

/// AMLA's range: the Cube computes `q . k` unscaled in FP32, so `max ||q|| max ||k||` must fit
/// `f32`; the logit bound must stay within [`AMLA_MAX_LOGIT`]; and V as for
/// [`check_f32_softmax`].
pub fn check_amla(p: &AttentionProblem, x: &AttentionInputs) -> Result<InputRange> {
    let r = InputRange::of(p, x);
    let dot = r.q_norm * r.k_norm;
    if dot > f32::MAX as f64 / 2.0 || r.logit_bound > AMLA_MAX_LOGIT {
        return Err(refuse(
            format!(
                "AMLA over inputs whose logits may reach {:.3e} (max row norm of q {:.3e}, of kv {:.3e})",
                r.logit_bound, r.q_norm, r.k_norm
            ),
            format!(
                "softmax_scale x max ||q|| x max ||kv|| up to {AMLA_MAX_LOGIT:e} (n_i = round(-m_i / ln 2) \
                 needs m_i's fraction in f32) and max ||q|| x max ||kv|| up to f32::MAX / 2 (the Cube's FP32 dot)"
            ),
        ));
    }
    let v_limit = f32::MAX as f64 / 2.0 / p.max_seqlen_k.max(1) as f64;
    if r.v_abs > v_limit {
        return Err(refuse(
            format!(
                "AMLA over V values up to {:.3e} over {} keys",
                r.v_abs, p.max_seqlen_k
            ),
            format!("|V| up to {v_limit:.3e} = f32::MAX / 2 / max_seqlen_k"),
        ));
    }
    Ok(r)
}

/// Largest `q` row norm TurboQuant accepts: the query is rotated (`Π q`) and projected
/// (`S q`, Gaussian `S` of up to 4096 rows whose row norms are about `sqrt(d) <= 32`), unscaled,
/// in `f32`, and its dot products with keys of norm up to 65504 are scaled only afterwards.
pub const TURBOQUANT_MAX_Q_NORM: f64 = 1e30;

/// [`check_f32_softmax`] plus the f16 norms of the TurboQuant cache and the unscaled query
/// products of the fused loop (module docs, [`TURBOQUANT_MAX_Q_NORM`]).
pub fn check_turboquant(p: &AttentionProblem, x: &AttentionInputs) -> Result<InputRange> {
    let r = check_f32_softmax(p, x)?;
    if r.q_norm > TURBOQUANT_MAX_Q_NORM {
        return Err(refuse(
            format!("TurboQuant over q rows of L2 norm up to {:.3e}", r.q_norm),
            format!(
                "q row norms up to {TURBOQUANT_MAX_Q_NORM:e} (the query is rotated and projected by the QJL sketch unscaled, in f32)"
            ),
        ));
    }
    let f16_max = DType::F16.max_finite() as f64;
    for (what, n) in [("k", r.k_norm), ("v", r.v_norm)] {
        if n > f16_max {
            return Err(refuse(
                format!("TurboQuant over {what} rows of L2 norm up to {n:.3e}"),
                format!(
                    "row norms up to {f16_max} (the compressed cache stores ||{what}|| as f16, as the fused kernel does)"
                ),
            ));
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttentionOptions, Tensor};

    fn inputs(val: f32, dtype: DType) -> AttentionInputs {
        let t = |s: &[usize]| Tensor {
            shape: s.to_vec(),
            dtype,
            data: vec![val; s.iter().product()],
        };
        AttentionInputs::new(t(&[1, 2, 2, 8]), t(&[1, 5, 1, 8]), t(&[1, 5, 1, 8]))
    }

    #[test]
    fn bounds_are_the_row_norms() {
        let x = inputs(3.0, DType::F32);
        let p = x.problem(AttentionOptions::default(), None).unwrap();
        let r = check_f32_softmax(&p, &x).unwrap();
        let norm = (8.0f64 * 9.0).sqrt();
        assert!((r.q_norm - norm).abs() < 1e-12 && (r.k_norm - norm).abs() < 1e-12);
        assert!((r.logit_bound - p.softmax_scale as f64 * 72.0).abs() < 1e-9);
        assert_eq!(r.v_abs, 3.0);
    }

    #[test]
    fn overflowing_logits_and_norms_are_refused_with_the_range() {
        let x = inputs(4e20, DType::F32);
        let p = x.problem(AttentionOptions::default(), None).unwrap();
        let e = check_f32_softmax(&p, &x).unwrap_err().to_string();
        assert!(e.contains("up to 1e37"), "{e}");
        // a tiny scale brings the same inputs back into range for exact and lean ...
        let p_small = AttentionProblem {
            softmax_scale: 1e-30,
            ..p.clone()
        };
        let x_v = AttentionInputs {
            v: Some(Tensor {
                data: vec![1.0; 40],
                ..x.v.clone().unwrap()
            }),
            ..x.clone()
        };
        assert!(check_f32_softmax(&p_small, &x_v).is_ok());
        // ... but not for TurboQuant, whose norms are f16
        let e = check_turboquant(&p_small, &x_v).unwrap_err().to_string();
        assert!(e.contains("65504"), "{e}");
        // v large enough that the weighted sum over 5 keys could overflow
        let x = AttentionInputs {
            v: Some(Tensor {
                data: vec![1e38; 40],
                ..x.v.clone().unwrap()
            }),
            ..inputs(1.0, DType::F32)
        };
        let p = x.problem(AttentionOptions::default(), None).unwrap();
        let e = check_f32_softmax(&p, &x).unwrap_err().to_string();
        assert!(e.contains("v values up to 1.000e38 over 5 keys"), "{e}");
    }
}
