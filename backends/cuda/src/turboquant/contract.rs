//! The compression paths and their contract ([`CompressPath`], [`check_compress_contract`]), and
//! the host twins of the fast kernels' arithmetic ([`FastDiv`], [`CodeLut`]).

#[cfg(doc)] // intra-doc links only
use super::TurboQuantCuda;
use ferrattn_core::turboquant::{CompressedKv, TurboQuantCodec, TurboQuantConfig};
use ferrattn_core::{AttentionInputs, AttentionProblem};

/// Which compression kernels [`TurboQuantCuda`] runs (docs/TURBOQUANT_CUDA.md, "Compression on
/// tensor cores", states each contract).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CompressPath {
    /// The reference: every f32/f64 step of the emulation as one IEEE instruction on CUDA
    /// cores. Codes and norms bit-exact with `TurboQuantCodec::compress`; FP32-issue-bound.
    #[default]
    Exact,
    /// Tensor cores, `Π` as one f16 matrix: a code may differ from the emulation's only where
    /// the emulation's rotated coordinate lies within [`FAST_CODE_MARGIN`] of a Lloyd-Max
    /// boundary; `‖x‖` as the emulation; `‖r‖` within [`FAST_RNORM_REL`]; a QJL sign may differ
    /// only where `|(S r)_i| <= FAST_SIGN_MARGIN ‖S_i‖ ‖r‖`.
    Fast,
    /// As [`Self::Fast`] with `Π` split into f16 hi + lo (two MMAs, about f32 accuracy): codes
    /// within [`SPLIT_CODE_MARGIN`] of a boundary only.
    Split,
}

/// Margin of [`CompressPath::Fast`]'s codes around a boundary (unit-norm rotated coordinates):
/// one f16 `Π` errs by at most `2^-11 Σ_k |Π_ok| |u_k| <= 2^-11`, plus `2^-14` for the f32 sums
/// of the MMA and of the emulation itself.
pub const FAST_CODE_MARGIN: f32 = 1.0 / 2048.0 + 1.0 / 16384.0;
/// Margin of [`CompressPath::Split`]'s codes: `Π - hi - lo` is below `2^-22 |Π|`; what remains is
/// the f32 accumulation of the MMA and the emulation's own sequential f32 sum (`<= 128 · 2^-24`).
/// Both margins also hold the fast kernels' folded lookup ([`CodeLut::code_scaled`]: exact for
/// the real quotient of the accumulator and the norm except within `2^-22 |y|` of a boundary).
pub const SPLIT_CODE_MARGIN: f32 = 1.0 / 16384.0;
/// Relative bound of the fast paths' `‖r‖` against the emulation's (one f16 rounding step of the
/// stored value, `2^-10`, from an f32 `γ` computed in the rotated basis).
pub const FAST_RNORM_REL: f32 = 1.0 / 1024.0;
/// Margin of the fast paths' QJL signs, relative to `‖S_i‖ ‖r‖`: `S Πᵀ` and the residual are
/// each rounded to f16 once (`2 · 2^-11`), doubled for the accumulation and `Π Πᵀ ≠ I` in f32.
pub const FAST_SIGN_MARGIN: f32 = 1.0 / 512.0;

impl CompressPath {
    /// How far from a Lloyd-Max boundary (unit-norm rotated coordinates) the emulation's
    /// coordinate may lie where this path's code differs from the emulation's: 0 for
    /// [`Self::Exact`] (no code may differ), [`FAST_CODE_MARGIN`], [`SPLIT_CODE_MARGIN`].
    pub fn code_margin(self) -> f32 {
        match self {
            CompressPath::Exact => 0.0,
            CompressPath::Fast => FAST_CODE_MARGIN,
            CompressPath::Split => SPLIT_CODE_MARGIN,
        }
    }
}

/// What [`check_compress_contract`] counted where a cache differs from the emulation's
/// compression (every difference inside its path's margins).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ContractCounts {
    /// Rows (token, KV head; keys and values counted apart) with at least one code off.
    pub rows_with_codes_off: usize,
    /// Coordinates whose code differs.
    pub codes_off: usize,
    /// Key rows with at least one QJL sign off.
    pub rows_with_signs_off: usize,
    /// QJL signs that differ.
    pub signs_off: usize,
    /// Largest relative difference of `‖r‖` (rows whose codes match).
    pub rnorm_max_rel: f64,
}

pub(super) fn l2(x: &[f32]) -> f32 {
    x.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt() as f32
}

/// Holds a cache `got` (downloaded, over `p`'s sequences of `x`) against the contract of the
/// compression `path` that wrote it (docs/TURBOQUANT_CUDA.md, "Compression on tensor cores";
/// host only): norms `‖x‖` bit-exact; each code equal to [`TurboQuantCodec::compress`]'s unless
/// the emulation's rotated coordinate lies within [`CompressPath::code_margin`] of a boundary;
/// on rows whose codes all match, `‖r‖` within [`FAST_RNORM_REL`] and each QJL sign equal
/// unless `|(S r)_i| <= FAST_SIGN_MARGIN ‖S_i‖ ‖r‖`. [`CompressPath::Exact`] allows no
/// difference at all (codes, signs and every norm bit for bit). The first violation is the
/// error, with where and by how much.
pub fn check_compress_contract(
    p: &AttentionProblem,
    x: &AttentionInputs,
    cfg: &TurboQuantConfig,
    got: &CompressedKv,
    path: CompressPath,
) -> std::result::Result<ContractCounts, String> {
    let d = p.head_dim_qk;
    let codec = TurboQuantCodec::new(cfg, d, p.head_dim_v);
    let want = codec.compress(p, x);
    let margin = path.code_margin();
    let exact = path == CompressPath::Exact;
    let (hk, sk) = (p.heads_kv, p.max_seqlen_k);
    let rows = p.batch * sk * hk;
    if got.k_idx.len() < rows * d
        || got.v_idx.len() < rows * d
        || got.k_norm.len() < rows
        || got.v_norm.len() < rows
    {
        return Err(format!(
            "the cache holds {} key codes / {} norms, {} / {rows} needed for {} sequences of {sk} tokens",
            got.k_idx.len(),
            got.k_norm.len(),
            rows * d,
            p.batch
        ));
    }
    let sketch = codec.key.qjl();
    let s = sketch.matrix();
    let sb = sketch.sign_bytes();
    let mut m = ContractCounts::default();
    let (mut idx, mut rot) = (vec![0u8; d], vec![0f32; d]);
    for b in 0..p.batch {
        for j in 0..p.seqlens_k[b] {
            for h in 0..hk {
                let r = (b * sk + j) * hk + h;
                let at = format!("(b {b}, token {j}, head {h})");
                if got.k_norm[r].to_bits() != want.k_norm[r].to_bits()
                    || got.v_norm[r].to_bits() != want.v_norm[r].to_bits()
                {
                    return Err(format!(
                        "norms of {at}: key {} vs {}, value {} vs {} (bit-exact on every path)",
                        got.k_norm[r], want.k_norm[r], got.v_norm[r], want.v_norm[r]
                    ));
                }
                for (keys, q) in [(true, codec.key.mse()), (false, &codec.value)] {
                    let row = if keys {
                        &x.k.row4(b, j, h)[..d]
                    } else {
                        x.v_row(p, b, j, h)
                    };
                    q.quantize_into(row, &mut idx, &mut rot);
                    let (g, w) = if keys {
                        (&got.k_idx[r * d..][..d], &want.k_idx[r * d..][..d])
                    } else {
                        (&got.v_idx[r * d..][..d], &want.v_idx[r * d..][..d])
                    };
                    let bounds = q.codebook().boundaries_f32();
                    let mut row_ok = true;
                    for o in 0..d {
                        if g[o] == w[o] {
                            continue;
                        }
                        let dist = bounds
                            .iter()
                            .map(|&bd| (rot[o] - bd).abs())
                            .fold(f32::INFINITY, f32::min);
                        if exact || dist > margin {
                            return Err(format!(
                                "{} row {at} coordinate {o}: code {} vs {} at {dist:e} from a boundary ({path:?} allows {margin:e})",
                                if keys { "key" } else { "value" },
                                g[o],
                                w[o]
                            ));
                        }
                        m.codes_off += 1;
                        row_ok = false;
                    }
                    if !row_ok {
                        m.rows_with_codes_off += 1;
                        continue;
                    }
                    if !(keys && cfg.key_qjl) {
                        continue;
                    }
                    let (wn, gn) = (want.r_norm[r], got.r_norm[r]);
                    let rel = ((gn - wn).abs() / wn.max(f32::MIN_POSITIVE)) as f64;
                    m.rnorm_max_rel = m.rnorm_max_rel.max(rel);
                    let rn_ok = if exact {
                        gn.to_bits() == wn.to_bits()
                    } else {
                        (gn - wn).abs() <= FAST_RNORM_REL * wn
                    };
                    if !rn_ok {
                        return Err(format!("‖r‖ of {at}: {gn} vs {wn} ({path:?})"));
                    }
                    // the emulation's residual r = Πᵀ (rot - c[idx]) and S r, as ProdQuantizer
                    let cb = q.codebook();
                    let rr: Vec<f32> = (0..d).map(|o| rot[o] - cb.centroid(idx[o])).collect();
                    let mut res = vec![0f32; d];
                    q.rotation().apply_t(&rr, &mut res);
                    let gamma = l2(&res);
                    let (gs, ws) = (&got.k_signs[r * sb..][..sb], &want.k_signs[r * sb..][..sb]);
                    let mut row_signs = 0;
                    for i in 0..sketch.rows() {
                        if (gs[i / 8] ^ ws[i / 8]) >> (i % 8) & 1 == 1 {
                            let si = &s[i * d..][..d];
                            let v: f32 = si.iter().zip(&res).map(|(a, b)| a * b).sum();
                            let bound = FAST_SIGN_MARGIN * l2(si) * gamma;
                            if exact || v.abs() > bound {
                                return Err(format!(
                                    "sign {i} of {at}: (S r)_i = {v:e} ({path:?} allows {}{bound:e})",
                                    if exact { "no difference; fast paths " } else { "" }
                                ));
                            }
                            row_signs += 1;
                        }
                    }
                    m.signs_off += row_signs;
                    m.rows_with_signs_off += (row_signs > 0) as usize;
                }
            }
        }
    }
    Ok(m)
}

/// Division of a non-negative `i32` by a constant as the kernels do it
/// (`tqf::fast_div`): `n / d = umulhi(n, mul) >> shr` for every `0 <= n < 2^31`, `mul = 0`
/// meaning `d = 1` (round-up reciprocal with `p = 31 + ceil(log2 d)`, as CUTLASS's
/// `FastDivmod`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastDiv {
    /// Multiplier (`ceil(2^p / d)`), 0 for `d = 1`.
    pub mul: u32,
    /// Shift after the high product (`p - 32`).
    pub shr: u32,
}

impl FastDiv {
    /// The divisor `d >= 1`.
    pub fn new(d: u32) -> FastDiv {
        assert!(d >= 1, "division by {d}");
        if d == 1 {
            return FastDiv { mul: 0, shr: 0 };
        }
        let l = 32 - (d - 1).leading_zeros(); // ceil(log2 d)
        let p = 31 + l;
        let m = (1u64 << p).div_ceil(d as u64);
        FastDiv {
            mul: u32::try_from(m).expect("the multiplier fits 32 bits"),
            shr: p - 32,
        }
    }

    /// `n / d` as the kernel computes it (`n < 2^31`).
    pub fn div(&self, n: u32) -> u32 {
        if self.mul == 0 {
            n
        } else {
            ((n as u64 * self.mul as u64) >> 32) as u32 >> self.shr
        }
    }
}

/// Entries of a [`CodeLut`] (`tqf::kLut`).
pub const CODE_LUT_BINS: usize = 256;

/// The fast kernels' code lookup (`tqf::code_of`): `u = fma(y, scale, off)` saturated to
/// `[0, 1]` (`[lo, hi]` in `y`), bin `k = rint(255 u)` (f32, as the kernel: two FMAs), entry
/// `k` = `{first boundary whose bin
/// is >= k (+inf if none), that boundary's index, centroid[index], centroid[index + 1]}`. The
/// bin is monotone in `y` and holds at most one boundary (checked here), so
/// `index + (boundary < y)` is exactly `#{boundaries < y}`, the emulation's `Codebook::index`.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeLut {
    /// `{boundary, index (f32 bits of a u32), centroid, next centroid}` per bin.
    pub entries: Vec<[f32; 4]>,
    /// Clamp of `y` below.
    pub lo: f32,
    /// Clamp of `y` above.
    pub hi: f32,
    /// `1 / (hi - lo)`: `u = sat(fma(y, scale, off))` runs over `[0, 1]` on `[lo, hi]`.
    pub scale: f32,
    /// `-lo / (hi - lo)`.
    pub off: f32,
}

impl CodeLut {
    /// The lookup of ascending `bounds` and their `bounds.len() + 1` centroids.
    pub fn new(bounds: &[f32], cents: &[f32]) -> CodeLut {
        let n = bounds.len();
        assert!(
            n >= 1 && cents.len() == n + 1,
            "a codebook of {n} bounds and {} centroids",
            cents.len()
        );
        let (b0, b1) = (bounds[0], bounds[n - 1]);
        let w = ((b1 - b0) / (CODE_LUT_BINS - 2) as f32).max(1e-3);
        let (lo, hi) = (b0 - w, b1 + w);
        let scale = 1.0 / (hi - lo);
        let off = -lo * scale;
        let mut lut = CodeLut {
            entries: Vec::new(),
            lo,
            hi,
            scale,
            off,
        };
        let bins: Vec<usize> = bounds.iter().map(|&b| lut.bin(b)).collect();
        assert!(
            bins.windows(2).all(|w| w[0] < w[1]),
            "two boundaries share a bin: {bins:?}"
        );
        lut.entries = (0..CODE_LUT_BINS)
            .map(|k| {
                let c = bins.iter().filter(|&&bk| bk < k).count();
                [
                    // + 0.0: no -0 boundary (the kernel compares by the sign of bound - y)
                    if c < n {
                        bounds[c] + 0.0
                    } else {
                        f32::INFINITY
                    },
                    f32::from_bits(c as u32),
                    cents[c],
                    cents[(c + 1).min(n)],
                ]
            })
            .collect();
        lut
    }

    /// The bin of `y`, computed as the kernel does: `u = fma.rn.sat(y, scale, off)` (NaN and
    /// below 0 give 0, above 1 gives 1), then `fma(u, 255, 2^23)` rounds `255 u` to an integer
    /// in the low bits.
    pub fn bin(&self, y: f32) -> usize {
        self.bin_of(y.mul_add(self.scale, self.off))
    }

    /// The bin of the grid coordinate `v` (before the saturation).
    fn bin_of(&self, v: f32) -> usize {
        let u = if v > 1.0 {
            1.0
        } else if v > 0.0 {
            v
        } else {
            0.0
        };
        let t = u.mul_add(255.0, 8_388_608.0f32);
        t.to_bits().wrapping_sub(0x4B00_0000) as usize
    }

    /// `(#{boundaries < y}, its centroid)` as the third compression pass's kernels looked them up
    /// from `y` (the table [`Self::code_scaled`] reads, exact for every `y`).
    pub fn code(&self, y: f32) -> (u8, f32) {
        let e = self.entries[self.bin(y)];
        // as the kernel: the sign bit of bound - y (equal values give +0)
        let up = (e[0] - y).to_bits() >> 31 == 1;
        let c = e[1].to_bits() + up as u32;
        (c as u8, if up { e[3] } else { e[2] })
    }

    /// The code as the fast kernels look it up since the fourth compression pass
    /// (`tqf::code_scaled`): from the product's accumulator `acc` (`‖x‖ y`) and the row norm
    /// `n`, the norm folded into the grid's scale, `s = f32(f32(1 / n) scale)`, the bin of
    /// `fma(acc, s, off)`, and into the comparison, `bound n < acc` exactly (the sign of
    /// `fma(bound, n, -acc)`). A zero row (`n = 0`) is looked up with `n = 1`, `s = scale`.
    ///
    /// Contract: the result is `#{b : b n < acc}`, the count for the real quotient `acc / n`,
    /// unless a boundary lies within `2^-22 |acc / n|` of it. Proof: `acc s = y' scale` for
    /// `y' = (acc / n)(1 + δ)`, `|δ| <= 2^-23 (1 + 2^-25)` (the two roundings of `s`), so the bin
    /// is exactly the bin of the real `y'`, for which the table is exact (see [`Self::code`]);
    /// its count `c` and `bound_c` then give `#{b < acc / n}` unless `b_{c-1}` or `b_{c+1}`
    /// lies between `y'` and `acc / n`. Such a near tie sits far inside the fast contract's
    /// code margin ([`FAST_CODE_MARGIN`], [`SPLIT_CODE_MARGIN`]), whose rounding budget the
    /// fold only shrinks (no `f32` quotient `acc * (1 / n)` is rounded any more). Host test
    /// `code_scaled_lookup_is_exact_outside_2e_22_of_a_boundary`.
    pub fn code_scaled(&self, acc: f32, n: f32) -> u8 {
        let (s, nn) = if n > 0.0 {
            ((1.0 / n) * self.scale, n)
        } else {
            (self.scale, 1.0)
        };
        let e = self.entries[self.bin_of(acc.mul_add(s, self.off))];
        let below = e[0].mul_add(nn, -acc).to_bits() >> 31;
        (e[1].to_bits() + below) as u8
    }
}
