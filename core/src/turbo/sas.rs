//! SAS, the sparsity-based softmax approximation (TurboAttention section 4, Eq. 13-15,
//! Algorithm 3 of appendix B).
//!
//! For `x <= 0`, write `t = -x = n + f` with integer `n = floor(t)` and fraction `f in [0, 1)`:
//! `e^x = e^-n * e^-f ~ LUT[n] * POLY(f)` (Eq. 13), with
//! `POLY(f) = -0.1025 f^3 + 0.4626 f^2 - 0.9922 f + 0.9996` (Eq. 15), and `SAS(x) = 0` for
//! `x < n_r` (Eq. 14; `n_r = -6` in the paper's runs).
//!
//! Bit-level definition (f32, round to nearest even):
//! 1. `if x < n_r return 0` (covers `-inf` and the flush below the threshold; `x = n_r`
//!    itself is kept). Positive `x` cannot occur (arguments are `s - rowmax`); it is treated as 0.
//! 2. `t = -x` (exact), `n = floor(t)` (an integer in `0..=-n_r`), `f = t - n` (exact by
//!    Sterbenz's lemma).
//! 3. `p = fma(fma(fma(C3, f, C2), f, C1), f, C0)`, each `fma` rounded once (`__fmaf_rn`), with
//!    `C3..C0` the `f32` nearest to the decimal coefficients: `0xbdd1eb85, 0x3eecd9e8,
//!    0xbf7e00d2, 0x3f7fe5c9`.
//! 4. `SAS(x) = LUT[n] * p`, where `LUT[n]` is `e^-n` rounded to `f32` ([`LUT_BITS`]).
//!
//! Algorithm 3's step 2 as extracted (`X[X < n_r] = n_r + 1` with `T[n_r + 1]` set to 0) is
//! garbled; Eq. 14 is unambiguous and is what is implemented: values below `n_r` give 0.
//! The paper evaluates POLY in FP16 on tensor cores; this emulation fixes it in f32 with FMAs,
//! which keeps the approximation error that of the polynomial itself (about 4e-4 absolute).

/// Cubic coefficient of POLY (Eq. 15).
pub const C3: f32 = -0.1025;
/// Quadratic coefficient of POLY.
pub const C2: f32 = 0.4626;
/// Linear coefficient of POLY.
pub const C1: f32 = -0.9922;
/// Constant of POLY; note `SAS(0) = C0 = 0.9996`, not 1.
pub const C0: f32 = 0.9996;

/// Most negative threshold the look-up table covers.
pub const MIN_THRESHOLD: i32 = -16;

/// `e^-n` rounded to nearest `f32`, as bit patterns, for `n = 0..=16`.
pub const LUT_BITS: [u32; 17] = [
    0x3f80_0000,
    0x3ebc_5ab2,
    0x3e0a_9555,
    0x3d4b_ed86,
    0x3c96_0aae,
    0x3bdc_c9ff,
    0x3b22_7290,
    0x3a6f_0b5d,
    0x39af_e108,
    0x3901_6791,
    0x383e_6bce,
    0x378c_1aa1,
    0x36ce_2a62,
    0x3617_b02a,
    0x355f_3638,
    0x34a4_3ae5,
    0x33f1_aade,
];

/// `LUT[n] = e^-n` as `f32`.
#[inline]
pub fn lut(n: usize) -> f32 {
    f32::from_bits(LUT_BITS[n])
}

/// POLY(f) of Eq. 15, Horner form with fused multiply-adds.
#[inline]
pub fn poly(f: f32) -> f32 {
    C3.mul_add(f, C2).mul_add(f, C1).mul_add(f, C0)
}

/// SAS approximation of `e^x` for `x <= 0` with integer threshold `n_r` (Eq. 14).
/// `n_r` must lie in `MIN_THRESHOLD..=-1` (checked by the config).
#[inline]
pub fn sas_exp(x: f32, n_r: i32) -> f32 {
    if x.is_nan() || x < n_r as f32 {
        return 0.0;
    }
    let t = (-x).max(0.0);
    let n = t.floor();
    let f = t - n;
    lut(n as usize) * poly(f)
}

/// The exponential an emulation run uses: SAS with threshold `n_r`, or `f32::exp` when SAS is
/// off (the FlashAttention baseline; not bit-reproducible across math libraries).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpKind {
    /// SAS with threshold `n_r`.
    Sas(i32),
    /// IEEE `expf` as the host's libm computes it.
    Exact,
}

impl ExpKind {
    /// `e^x` (approximated) for `x <= 0`; `-inf` gives 0.
    #[inline]
    pub fn exp(self, x: f32) -> f32 {
        match self {
            ExpKind::Sas(n_r) => sas_exp(x, n_r),
            ExpKind::Exact => x.exp(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turbo_sas_lut_is_e_to_minus_n() {
        for (n, _) in LUT_BITS.iter().enumerate() {
            assert_eq!(lut(n), (-(n as f64)).exp() as f32, "LUT[{n}]");
        }
        assert_eq!(C3.to_bits(), 0xbdd1eb85);
        assert_eq!(C2.to_bits(), 0x3eecd9e8);
        assert_eq!(C1.to_bits(), 0xbf7e00d2);
        assert_eq!(C0.to_bits(), 0x3f7fe5c9);
    }

    /// The error of SAS on `[n_r, 0]` is that of POLY on `[0, 1]` scaled by `e^-n`:
    /// POLY's largest absolute error is 4.0e-4 (at f = 0: 0.9996 vs 1), its largest relative
    /// error 1.1e-3 (near f = 1: 0.3675 vs e^-1 = 0.36788). Below `n_r`, SAS returns 0 while
    /// `e^x < e^n_r` (2.5e-3 for n_r = -6).
    #[test]
    fn turbo_sas_error_bound_on_threshold_range() {
        let n_r = -6;
        let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
        let steps = 600_000;
        for i in 0..=steps {
            let x = n_r as f64 * i as f64 / steps as f64;
            let approx = sas_exp(x as f32, n_r) as f64;
            let exact = (x as f32 as f64).exp();
            max_abs = max_abs.max((approx - exact).abs());
            max_rel = max_rel.max((approx - exact).abs() / exact);
        }
        assert!(max_abs <= 4.1e-4, "max abs error {max_abs:e}");
        assert!(max_rel <= 1.2e-3, "max rel error {max_rel:e}");
        // and the bound is attained: SAS(0) = 0.9996 exactly as the paper's constant says
        assert_eq!(sas_exp(0.0, n_r), C0);
        assert!(
            max_abs >= 3.9e-4,
            "max abs error {max_abs:e} should be POLY's 4e-4 at f = 0"
        );
    }

    #[test]
    fn turbo_sas_threshold_and_edges() {
        let n_r = -6;
        assert_eq!(sas_exp(-6.0, n_r), lut(6) * C0);
        assert!(sas_exp(-6.0, n_r) > 0.0);
        assert_eq!(sas_exp(-6.000001, n_r), 0.0);
        assert_eq!(sas_exp(-100.0, n_r), 0.0);
        assert_eq!(sas_exp(f32::NEG_INFINITY, n_r), 0.0);
        // flushed mass below the threshold is at most e^n_r
        assert!((-6.000001f32).exp() < 2.48e-3);
        // at the integer seams LUT[n] POLY(0) meets LUT[n-1] POLY(1-): 0.9996 vs e * 0.3675 =
        // 0.99898, a jump of 6.2e-4 relative; nothing larger hides there
        for n in 1..=6 {
            let seam = -(n as f32);
            let toward_zero = f32::from_bits(seam.to_bits() - 1); // one ulp less negative
            let (a, b) = (sas_exp(seam, n_r), sas_exp(toward_zero, n_r));
            let jump = (a - b).abs() / a;
            assert!(
                (5e-4..=7e-4).contains(&jump),
                "seam at {seam}: {a} vs {b}, jump {jump:e}"
            );
        }
        // a wider threshold keeps more of the tail
        assert!(sas_exp(-7.5, -8) > 0.0);
        assert_eq!(sas_exp(-7.5, -6), 0.0);
    }
}
