//! TurboAttention prefill (Algorithm 1) and decode (Algorithm 2), appendix A.
//!
//! Both run the same tile step ([`attend_tile`]): INT8 `Q K^T` with exact `i32` accumulation,
//! SAS online softmax, `P~` quantized to INT8 per tile, INT8 `P V` with exact `i32`
//! accumulation, and the `f32` running state `m, l, O` of FlashAttention-2. Prefill tiles are
//! `B_r` query rows of one head against `B_c` keys of its KV head, with Q, K and V quantized to
//! INT8 per block (Alg. 1 line "compute s_Q_i, Q_i^q1, s_K_j, K_j^q1, s_V_j, V_j^q1"). Decode
//! quantizes the one query row (Alg. 2 "s_Q = max(abs(Q))/119") and walks the cache's INT8
//! tiles: every compressed block decompressed to INT8 (Alg. 2 "K_j^q1 = K_j^q2 s^int + z"),
//! then the INT8 buffer.
//!
//! Tiles are visited in ascending key order; causal prefill skips tiles no row of the query
//! tile can see, which changes no bit (such a tile leaves every row's state untouched).

use super::cache::{SeqCache, TurboKvCache};
use super::quant::{rne, Int8Block, INT8_DIVISOR, INT8_MAX_CODE};
use super::sas::ExpKind;
use super::TurboConfig;
use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, CoreError, DType, Provenance, Result,
    Tensor,
};
use rayon::prelude::*;

/// One finished query row: O (`Dv` values) and LSE.
pub type RowOut = (Vec<f32>, f32);

/// Running softmax state of one query row (FlashAttention-2, as in Alg. 1).
#[derive(Clone, Debug, PartialEq)]
pub struct RowState {
    /// Largest scaled logit seen (`-inf` before the first visible key).
    pub m: f32,
    /// Sum of the quantized, rescaled probabilities: `sum_tiles s_P x rowsum(Q(P~))`.
    pub l: f32,
    /// Unnormalized output, one entry per V channel.
    pub acc: Vec<f32>,
}

impl RowState {
    /// The state before any key.
    pub fn new(dv: usize) -> RowState {
        RowState {
            m: f32::NEG_INFINITY,
            l: 0.0,
            acc: vec![0.0; dv],
        }
    }

    /// `O = acc / l` and `L = m + ln(l)` (Alg. 1 last lines); zeros and `-inf` for a row that
    /// saw no key.
    pub fn finish(&self) -> (Vec<f32>, f32) {
        if self.m == f32::NEG_INFINITY || self.l == 0.0 {
            return (vec![0.0; self.acc.len()], f32::NEG_INFINITY);
        }
        (
            self.acc.iter().map(|a| a / self.l).collect(),
            self.m + self.l.ln(),
        )
    }
}

/// One tile step of Alg. 1 (inner loop body) and Alg. 2 (loop body).
///
/// `q`: INT8 query rows (`rows x d`); `visible[i]`: keys `0..visible[i]` (absolute positions)
/// are visible to row `i`; `k`, `v`: INT8 tile of `k.rows` keys starting at position `first`.
/// Integer and `f32` steps, in order (the bit-exact contract):
/// 1. `S_ij = f32(sum_c q_ic k_jc) * alpha`, `alpha = (s_q * s_k) * softmax_scale`; masked
///    entries are `-inf`.
/// 2. `m_new = max(m, max_j S_ij)`; `r = 1` if `m_new == m`, else `EXP(m - m_new)`.
/// 3. `P~_ij = EXP(S_ij - m_new)` (0 where masked).
/// 4. `s_P = max_ij P~_ij / 119` over the whole tile; `Q(P~) = clamp(rne(P~ / s_P), 0, 127)`.
/// 5. `l = fma(f32(sum_j Q(P~)_ij), s_P, l * r)`;
///    `O_ic = fma(f32(sum_j Q(P~)_ij v_jc), s_P * s_v, O_ic * r)`.
#[allow(clippy::too_many_arguments)] // the operands of one tile step, named as in Alg. 1
pub fn attend_tile(
    q: &Int8Block,
    softmax_scale: f32,
    visible: &[usize],
    k: &Int8Block,
    v: &Int8Block,
    first: usize,
    exp: ExpKind,
    states: &mut [RowState],
) {
    let (rows, n) = (q.rows, k.rows);
    if n == 0 {
        return;
    }
    let d = q.codes.len() / rows.max(1);
    let dv = v.codes.len() / n;
    let alpha = (q.scale * k.scale) * softmax_scale;
    let mut p = vec![0.0f32; rows * n];
    let mut r = vec![1.0f32; rows];
    let mut pmax = 0.0f32;
    let mut s = vec![f32::NEG_INFINITY; n];
    for i in 0..rows {
        let vis = visible[i].saturating_sub(first).min(n);
        if vis == 0 {
            continue; // nothing visible: state unchanged (m_new = m, r = 1, P~ = 0)
        }
        let qi = &q.codes[i * d..(i + 1) * d];
        let mut tile_max = f32::NEG_INFINITY;
        for (j, sj) in s.iter_mut().enumerate().take(vis) {
            let kj = &k.codes[j * d..(j + 1) * d];
            let dot: i32 = qi.iter().zip(kj).map(|(&a, &b)| a as i32 * b as i32).sum();
            *sj = dot as f32 * alpha;
            tile_max = tile_max.max(*sj);
        }
        let st = &states[i];
        let m_new = st.m.max(tile_max);
        r[i] = if m_new == st.m {
            1.0
        } else {
            exp.exp(st.m - m_new)
        };
        for j in 0..vis {
            let pij = exp.exp(s[j] - m_new);
            p[i * n + j] = pij;
            pmax = pmax.max(pij);
        }
        states[i].m = m_new;
    }
    let s_p = pmax / INT8_DIVISOR;
    let c_pv = s_p * v.scale;
    let mut acc = vec![0i32; dv];
    for i in 0..rows {
        let st = &mut states[i];
        if visible[i] <= first {
            continue; // no visible key in this tile: the row's state is left as it was
        }
        acc.iter_mut().for_each(|a| *a = 0);
        let mut rowsum = 0i32;
        for j in 0..n {
            let code = if s_p == 0.0 {
                0
            } else {
                rne(p[i * n + j] / s_p).clamp(0.0, INT8_MAX_CODE as f32) as i32
            };
            if code == 0 {
                continue;
            }
            rowsum += code;
            for (a, &vc) in acc.iter_mut().zip(&v.codes[j * dv..(j + 1) * dv]) {
                *a += code * vc as i32;
            }
        }
        st.l = (rowsum as f32).mul_add(s_p, st.l * r[i]);
        for (o, &a) in st.acc.iter_mut().zip(&acc) {
            *o = (a as f32).mul_add(c_pv, *o * r[i]);
        }
    }
}

/// How `P~` becomes the INT8 operand of `P V` in a prefill tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PQuant {
    /// The paper's (Alg. 1): `s_P = max(P~ over the tile) / 119`, signed INT8 codes
    /// ([`attend_tile`]; the emulation, and the bit-exact and wgmma kernels).
    #[default]
    PerTile,
    /// The fast contract of `turbo_prefill_wgf_*` (issue 11; [`attend_tile_fixed_p`]): `P~` in
    /// `[0, 1]` quantized against the bound it has before the tile, `s_P = 1/255`, u8 codes.
    FixedU8,
}

/// `x` rounded to the nearest f16 value (ties to even), returned as f32.
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Whether K/V blocks `j` and `j + 1` of a query block that visits `nt` blocks form one chunk
/// of the fast contract ([`attend_chunk_fixed_p`]): both exist, no SAS threshold applies
/// (`threshold` is [`fixed_p_threshold`]'s), and the two V block scales are positive and within
/// a factor 2 (`2 min >= max`, f32).
pub fn fixed_p_pairable(j: usize, nt: usize, threshold: bool, vs0: f32, vs1: f32) -> bool {
    let (lo, hi) = (vs0.min(vs1), vs0.max(vs1));
    j + 1 < nt && !threshold && lo > 0.0 && 2.0 * lo >= hi
}

/// The chunks of the fast contract for a query block that visits the first `nt` K/V blocks
/// (V block scales `vs`), as `(first block, blocks)`: taken greedily from block 0, two blocks
/// where [`fixed_p_pairable`], else one.
pub fn fixed_p_chunks(vs: &[f32], nt: usize, threshold: bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut j = 0;
    while j < nt {
        let n = if fixed_p_pairable(
            j,
            nt,
            threshold,
            vs[j],
            vs.get(j + 1).copied().unwrap_or(0.0),
        ) {
            2
        } else {
            1
        };
        out.push((j, n));
        j += n;
    }
    out
}

/// One prefill step of the fast contract ([`PQuant::FixedU8`]) over a chunk of one or two
/// consecutive K/V blocks ([`fixed_p_chunks`]); the CPU twin of `turbo_prefill_wgf_*`, step for
/// step (`m` in log2 units, `l` and `O` in code units, i.e. 255 times the paper's;
/// [`finish_fixed_p`] undoes both). `blocks[h]` starts at key `firsts[h]`.
/// 1. Per block `h`: `c2_h = ((s_q * s_k_h) * softmax_scale) * log2(e)`. The chunk's reference
///    V scale `s_ref = max_h s_v_h`; for a block whose scale is below it (two blocks, different
///    scales) `w = s_ref / s_v_h` (f32 division) and `off_h = -log2(w)` (the kernel:
///    `lg2.approx`), else `w = 1`, `off = 0`. A one-block chunk is round 3's tile step.
/// 2. `t = max_h f32(max_j dot_ij over block h's visible keys) * c2_h` (the integer maximum is the
///    logit maximum: `c2 >= 0`); `m_new = max(m, t)`; `r = 1` if `m_new == m`, else
///    `2^(m - m_new)`.
/// 3. `x = fma(f32(dot), c2_h, off_h - m_new)`; `p = f16(2^x)` (the kernel: `ex2.approx`, then
///    f16), i.e. `p = 2^(x - m) s_v_h / s_ref`: the codes of both blocks against one scale.
/// 4. SAS threshold (one-block chunks only): with SAS on and `n_r >= -5`, `p < f16(e^n_r)`
///    gives 0; below that the u8 rounding is the cut (`p < 1/510`, `x < -6.23` natural-log
///    units; in a two-block chunk the block with the smaller V scale cuts at up to twice that
///    `p`, since its codes carry `s_v_h / s_ref >= 1/2`).
/// 5. `code = rne(255 p)` in `0..=255` (the kernel: `fma.f16x2(p, 255, 1024)`).
/// 6. `l = fma(l, r, fma(f32(rowsum_1), w_1, f32(rowsum_0) * w_0))` (`rowsum_1 = 0`, `w_1 = 1`
///    for one block), `O = fma(f32(sum_h code . V_h^q1), s_ref, O * r)`: P V of the whole chunk
///    accumulates in INT32 and O is folded once.
#[allow(clippy::too_many_arguments)] // the operands of one chunk step, named as in Alg. 1
pub fn attend_chunk_fixed_p(
    q: &Int8Block,
    softmax_scale: f32,
    visible: &[usize],
    blocks: &[(&Int8Block, &Int8Block)],
    firsts: &[usize],
    threshold: Option<i32>,
    states: &mut [RowState],
) {
    assert!(matches!(blocks.len(), 1 | 2) && firsts.len() == blocks.len());
    let rows = q.rows;
    let d = q.codes.len() / rows.max(1);
    let pair = blocks.len() == 2;
    let vs0 = blocks[0].1.scale;
    let vs1 = if pair { blocks[1].1.scale } else { vs0 };
    let s_ref = if pair { vs0.max(vs1) } else { vs0 };
    let w_lo = if pair && vs0 != vs1 {
        s_ref / vs0.min(vs1)
    } else {
        1.0
    };
    let off_lo = if w_lo == 1.0 { 0.0 } else { -w_lo.log2() };
    let lo0 = pair && vs0 < vs1;
    let off = [
        if lo0 { off_lo } else { 0.0 },
        if lo0 { 0.0 } else { off_lo },
    ];
    let w = [if lo0 { w_lo } else { 1.0 }, if lo0 { 1.0 } else { w_lo }];
    let c2: Vec<f32> = blocks
        .iter()
        .map(|(k, _)| ((q.scale * k.scale) * softmax_scale) * std::f32::consts::LOG2_E)
        .collect();
    let thr = threshold.map(|n_r| round_f16((n_r as f32 * std::f32::consts::LOG2_E).exp2()));
    let dv = blocks[0].1.codes.len() / blocks[0].1.rows.max(1);
    let mut dots: Vec<Vec<i32>> = blocks.iter().map(|(k, _)| vec![0i32; k.rows]).collect();
    let mut acc = vec![0i32; dv];
    for i in 0..rows {
        let vis: Vec<usize> = blocks
            .iter()
            .zip(firsts)
            .map(|((k, _), &f)| visible[i].saturating_sub(f).min(k.rows))
            .collect();
        if vis.iter().all(|&n| n == 0) {
            continue; // nothing visible: the state is left as it was
        }
        let qi = &q.codes[i * d..(i + 1) * d];
        let mut t = f32::NEG_INFINITY;
        for (h, ((k, _), dh)) in blocks.iter().zip(dots.iter_mut()).enumerate() {
            for (j, dj) in dh.iter_mut().enumerate().take(vis[h]) {
                let kj = &k.codes[j * d..(j + 1) * d];
                *dj = qi.iter().zip(kj).map(|(&a, &b)| a as i32 * b as i32).sum();
            }
            if let Some(&imax) = dh[..vis[h]].iter().max() {
                t = t.max(imax as f32 * c2[h]);
            }
        }
        let st = &mut states[i];
        let m_new = st.m.max(t);
        let r = if m_new == st.m {
            1.0
        } else {
            (st.m - m_new).exp2()
        };
        acc.iter_mut().for_each(|a| *a = 0);
        let mut rowsum = [0i32; 2];
        for (h, (_, v)) in blocks.iter().enumerate() {
            let nb = off[h] - m_new;
            for (j, &dot) in dots[h].iter().enumerate().take(vis[h]) {
                let x = (dot as f32).mul_add(c2[h], nb);
                let mut p = round_f16(x.exp2());
                if thr.is_some_and(|t| p < t) {
                    p = 0.0;
                }
                let code = rne(255.0 * p).min(255.0) as i32;
                if code == 0 {
                    continue;
                }
                rowsum[h] += code;
                for (a, &vc) in acc.iter_mut().zip(&v.codes[j * dv..(j + 1) * dv]) {
                    *a += code * vc as i32;
                }
            }
        }
        let lt = (rowsum[1] as f32).mul_add(w[1], rowsum[0] as f32 * w[0]);
        st.m = m_new;
        st.l = st.l.mul_add(r, lt);
        for (o, &a) in st.acc.iter_mut().zip(&acc) {
            *o = (a as f32).mul_add(s_ref, *o * r);
        }
    }
}

/// The fewest K/V blocks a query block visits for the fast contract's INT32 path (short rows
/// keep the chunks: the integer reference costs up to one bit of a row's largest code, and a
/// row's LSE moves by `1 / l` where the kernel's `ex2.approx` moves a code by one; `l` is
/// smallest where a row sees few keys).
pub const FIXED_P_INT_MIN_TILES: usize = 4;

/// The largest spread of V block scales (`max / min`, f32, exclusive) under which a query block
/// takes the fast contract's INT32 path (issue 11, round 8; round 7 allowed a factor 2): the
/// accumulator's unit is `s_u 2^-n` with `n = floor(log2(s_u / s_v))` of the tile's block, at most
/// 6, and the overflow guard of [`attend_tile_fixed_p_int`] keeps `l` below `2^(23 - d)`, `d`
/// the tile's `n` less the smallest `n` so far, so that `|acc| <= 127 2^d l` stays inside i32.
pub const FIXED_P_INT_MAX_SPREAD: f32 = 128.0;

/// The fast contract's INT32 path for a query block: `s_u` (the largest V block scale it
/// visits) and `r` (the largest unit exponent `n` of its blocks, `floor(log2(s_u / min))`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IntUnit {
    /// The largest visited V block scale.
    pub s_u: f32,
    /// `floor(log2(s_u / min vs))` (f32 quotient), in `0..=6`.
    pub r: i32,
}

/// The INT32 path's unit for a query block that visits the K/V blocks of scales `vs` (its first
/// `nt`): `Some` when it visits at least [`FIXED_P_INT_MIN_TILES`] blocks, no SAS threshold
/// applies and every scale lies in `[2^-64, 2^64]` with `max / min < 128` (f32 quotient,
/// [`FIXED_P_INT_MAX_SPREAD`]); else `None` (the query block takes the chunk path,
/// [`attend_chunk_fixed_p`]). Round 7 asked `2 min >= max`; real activations (a sequence's
/// partial last block, tokens of small norm) leave that window.
pub fn fixed_p_int_scale(vs: &[f32], threshold: bool) -> Option<IntUnit> {
    if threshold || vs.len() < FIXED_P_INT_MIN_TILES {
        return None;
    }
    let lo = vs.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = vs.iter().copied().fold(0.0f32, f32::max);
    let (min_s, max_s) = (f32::from_bits(63 << 23), f32::from_bits(191 << 23)); // 2^-64, 2^64
    if !(lo >= min_s && hi <= max_s) {
        return None;
    }
    let q = hi / lo;
    (q < FIXED_P_INT_MAX_SPREAD).then(|| IntUnit {
        s_u: hi,
        r: unit_exponent(q),
    })
}

/// `floor(log2(w))` of a normal `w >= 1`, from its exponent field.
fn unit_exponent(w: f32) -> i32 {
    ((w.to_bits() >> 23) & 0xff) as i32 - 127
}

/// `m` of an [`IntRowState`] that has seen no key.
pub const FIXED_P_NO_REF: i32 = -(1 << 24);

/// A row's state under the INT32 path of the fast contract ([`attend_tile_fixed_p_int`]).
#[derive(Clone, Debug)]
pub struct IntRowState {
    /// Reference for the codes, log2 units, an integer ([`FIXED_P_NO_REF`] before any key).
    pub m: i32,
    /// Sum of code sums, each times its block's `w'` (`s_u / s_V` over `2^n`), in the units of `m`
    /// (code units).
    pub l: f32,
    /// `sum code . V^q1` over the tiles so far, in units of `s_u 2^-n` and of `m`.
    pub acc: Vec<i32>,
    /// The unit exponent of `acc` (the last tile's `n`, 0 before any).
    pub n: i32,
    /// The smallest `n` so far (`i32::MAX` before any tile).
    pub n_min: i32,
    /// The last tile's move of `m` (`min(m_new - m, 127)`), its code sum and `w'` (`s_u / s_V`
    /// over `2^n`): the kernel adds a tile's sum to `l` one tile late.
    pending: Option<(i32, i32, f32)>,
}

impl IntRowState {
    /// The state before any key.
    pub fn new(dv: usize) -> IntRowState {
        IntRowState {
            m: FIXED_P_NO_REF,
            l: 0.0,
            acc: vec![0; dv],
            n: 0,
            n_min: i32::MAX,
            pending: None,
        }
    }

    /// `l = fma(l, 2^-k, f32(rowsum) * w)` of the pending tile (`2^-k` exact, 0 from k = 127).
    fn settle(&mut self) {
        if let Some((k, rowsum, w)) = self.pending.take() {
            let scale = if k >= 127 {
                0.0
            } else {
                f32::from_bits(((127 - k) as u32) << 23)
            };
            self.l = self.l.mul_add(scale, rowsum as f32 * w);
        }
    }

    /// `O = (f32(acc) * (s_u * 2^-n)) * (1 / l)` and `LSE = (m ln 2 - ln 255) + ln(l)`, as the
    /// kernel finishes a row; zeros and `-inf` for a row that saw no key.
    pub fn finish(mut self, s_u: f32) -> RowOut {
        self.settle();
        let s_u = s_u * f32::from_bits(((127 - self.n) as u32) << 23);
        if self.m == FIXED_P_NO_REF || self.l == 0.0 {
            return (vec![0.0; self.acc.len()], f32::NEG_INFINITY);
        }
        let inv = 1.0 / self.l;
        let m = self.m as f32 * std::f32::consts::LN_2 - 255f32.ln();
        (
            self.acc.iter().map(|&a| (a as f32 * s_u) * inv).collect(),
            m + self.l.ln(),
        )
    }
}

/// One 64-key tile of the fast contract's INT32 path (issue 11, rounds 7 and 8; the CPU twin of
/// `turbo_prefill_wgf_*` where [`fixed_p_int_scale`] gives `unit`; the kernel follows it since round
/// 10, taking `n`, the unit's move and the guard's `149 - d` per tile from its table), step
/// for step. P V is never
/// folded into f32: `acc` holds `sum code . V^q1` of every tile in INT32, in units of `s_u 2^-n`
/// with a per-tile unit exponent `n` (an exact shift converts `acc` between units), against an
/// integer reference `m`:
/// 1. `w = s_u / s_v` (f32 division; 1 when equal) in `[1, 128)`, `n = floor(log2 w)` (the
///    exponent field), `w' = w 2^-n` in `[1, 2)` (the mantissa), `off = -log2(w')` (the kernel:
///    `lg2.approx`; 0 when `w' = 1`), `c2 = ((s_q * s_k) * softmax_scale) * log2(e)`.
/// 2. `t = f32(max dot over the row's visible keys) * c2` (`-inf` if none); the guard `g =
///    max(0, e(l) - 22 + d)` with `e(l)` the exponent field of `l` less 127 (`floor(log2 l)`,
///    -127 for 0) and `d = n - n_min` (`n_min` the smallest `n` of the tiles so far, this one
///    included): the fewest halvings that bring `l` below `2^(23 - d)`; `m_new = max(m,
///    min(ceil(t), 2^24), m + g)` (`ceil` saturating to i32; the `l` the kernel tests is the
///    row's `l` through the tile before the previous one, see 5); `k = min(m_new - m, 127)`.
/// 3. `x = fma(f32(dot), c2, off - f32(m_new))`, `p = f16(2^x)`, `code = rne(255 p)` (`x <= 0`:
///    `p <= 1`): the codes of the block in units of `s_u 2^-n`.
/// 4. `s = k + (n_acc - n)`; `acc = shift(acc, s) + sum code . V^q1` with `shift` an arithmetic
///    right shift by `min(s, 31)` (floor) for `s >= 0` and a left shift by `-s <= R` (exact)
///    otherwise; the first tile sets `acc`; `n_acc = n`. `|acc| <= 127 2^d l` (a key's code
///    counts in `l` at least once and in `acc` at most `2^d` times its V code), and the guard
///    keeps `l` below `2^(23 - d) + 2 x 2 x 64 x 255`, so `|acc| < 127 (2^23 + 2^d 65280) < 2^31`
///    for `d <= 6`.
/// 5. `l = fma(l, 2^-k, f32(rowsum) * w')` (exact `2^-k`), applied when the next tile is taken
///    (the kernel's order: it only moves when the guard of 2 sees `l`).
#[allow(clippy::too_many_arguments)] // the operands of one tile step, named as in Alg. 1
pub fn attend_tile_fixed_p_int(
    q: &Int8Block,
    softmax_scale: f32,
    visible: &[usize],
    k: &Int8Block,
    v: &Int8Block,
    first: usize,
    unit: IntUnit,
    states: &mut [IntRowState],
) {
    attend_tile_fixed_p_int_headroom(q, softmax_scale, visible, k, v, first, unit, 0, states);
}

/// [`attend_tile_fixed_p_int`] with a headroom rule on `m` (issue 11, prefill round 14; an
/// experiment, not the contract, which is `headroom = 0`): where a row's `ceil(t)` passes its
/// `m` past the row's first tile, `m` moves to `ceil(t) + headroom` instead of `ceil(t)`, so that
/// fewer tiles move it (the kernel shifts a warp's whole `oi` when one of its 16 rows moves) at
/// the price of codes below `255 2^-headroom` until the next move. The kernel's diagnostic build
/// `-DFERRATTN_WGF_HEADROOM=h` follows the same rule (`docs/TURBO_CUDA.md`, round 14).
#[allow(clippy::too_many_arguments)] // the operands of one tile step, named as in Alg. 1
pub(crate) fn attend_tile_fixed_p_int_headroom(
    q: &Int8Block,
    softmax_scale: f32,
    visible: &[usize],
    k: &Int8Block,
    v: &Int8Block,
    first: usize,
    unit: IntUnit,
    headroom: i32,
    states: &mut [IntRowState],
) {
    let rows = q.rows;
    let d = q.codes.len() / rows.max(1);
    let dv = v.codes.len() / v.rows.max(1);
    let w = if v.scale == unit.s_u {
        1.0
    } else {
        unit.s_u / v.scale
    };
    let n = unit_exponent(w);
    let wm = f32::from_bits((w.to_bits() & 0x007f_ffff) | 0x3f80_0000);
    let off = if wm == 1.0 { 0.0 } else { -wm.log2() };
    let n_min = |st: &IntRowState| st.n_min.min(n);
    let c2 = ((q.scale * k.scale) * softmax_scale) * std::f32::consts::LOG2_E;
    let mut dots = vec![0i32; k.rows];
    let mut tile = vec![0i32; dv];
    for (i, st) in states.iter_mut().enumerate().take(rows) {
        let vis = visible[i].saturating_sub(first).min(k.rows);
        let qi = &q.codes[i * d..(i + 1) * d];
        for (j, dj) in dots.iter_mut().enumerate().take(vis) {
            let kj = &k.codes[j * d..(j + 1) * d];
            *dj = qi.iter().zip(kj).map(|(&a, &b)| a as i32 * b as i32).sum();
        }
        let t = dots[..vis]
            .iter()
            .max()
            .map_or(f32::NEG_INFINITY, |&imax| imax as f32 * c2);
        let nm = n_min(st);
        let e_l = ((st.l.to_bits() >> 23) & 0xff) as i32 - 127;
        let g = (e_l - 22 + (n - nm)).max(0);
        let mut c = (t.ceil() as i32).min(1 << 24);
        if headroom > 0 && st.m != FIXED_P_NO_REF && c > st.m {
            c += headroom;
        }
        let m_new = st.m.max(c).max(st.m + g);
        let kk = (m_new - st.m).min(127);
        let nb = off - m_new as f32;
        tile.iter_mut().for_each(|a| *a = 0);
        let mut rowsum = 0i32;
        for (j, &dot) in dots.iter().enumerate().take(vis) {
            let x = (dot as f32).mul_add(c2, nb);
            let p = round_f16(x.exp2());
            let code = rne(255.0 * p).min(255.0) as i32;
            if code == 0 {
                continue;
            }
            rowsum += code;
            for (a, &vc) in tile.iter_mut().zip(&v.codes[j * dv..(j + 1) * dv]) {
                *a += code * vc as i32;
            }
        }
        let sh = kk + (st.n - n);
        for (a, &t) in st.acc.iter_mut().zip(&tile) {
            let shifted = if sh >= 0 { *a >> sh.min(31) } else { *a << -sh };
            *a = if first == 0 { 0 } else { shifted } + t;
        }
        st.n = n;
        st.n_min = nm;
        // the previous tile's sum reaches l now (after this tile's guard)
        st.settle();
        st.pending = Some((kk, rowsum, wm));
        st.m = m_new;
    }
}

/// `O = acc * (1 / l)` and `LSE = (m ln 2 - ln 255) + ln(l)` of a [`attend_chunk_fixed_p`] state
/// (as the kernel finishes it); zeros and `-inf` for a row that saw no key.
pub fn finish_fixed_p(st: &RowState) -> RowOut {
    if st.m == f32::NEG_INFINITY || st.l == 0.0 {
        return (vec![0.0; st.acc.len()], f32::NEG_INFINITY);
    }
    let inv = 1.0 / st.l;
    let m = st.m * std::f32::consts::LN_2 - 255f32.ln();
    (st.acc.iter().map(|a| a * inv).collect(), m + st.l.ln())
}

/// The decode tile step under the *fast contract* of the CUDA decode (`Options::fast_turbo_decode`,
/// `unit_softmax_fast` in cuda-kernels/turbo_decode.cu): the CPU model of that contract, so that
/// its accuracy can be measured without a GPU (`accuracy::fast_decode_accuracy`). It departs
/// from [`attend_tile`] in two steps, each row on its own (a decode tile has one row per query
/// head, and the bit-exact tile's `s_P` is then that row's too):
/// - `EXP` is `e^x` (here `f32::exp2` of `x log2 e`; the kernel's `ex2.approx` is within about
///   2^-22 relative of it) instead of SAS; SAS's threshold stays (0 for `x < n_r`, keys and
///   rescale; none when `exp` is [`ExpKind::Exact`]);
/// - P is quantized against the tile's largest logit `tmax = f32(max_j dot_j) alpha`: `s_P =
///   e^(tmax - m_new) / 119` and `Q(P~)_j = rne(2^(dot_j A + B))` with `A = alpha log2 e`,
///   `B = log2 119 - f32(max_j dot_j) A` (one FMA each), no division by `s_P` and no clamp (the
///   largest code is 119).
///
/// `alpha >= 0` (a positive softmax scale), so the largest dot product is the largest logit.
/// Steps 1 (integer scores), 5 (the `l` and `O` updates, `s_P s_v` one product) are
/// [`attend_tile`]'s.
#[allow(clippy::too_many_arguments)] // the operands of one tile step, as attend_tile
pub fn attend_tile_fast(
    q: &Int8Block,
    softmax_scale: f32,
    visible: &[usize],
    k: &Int8Block,
    v: &Int8Block,
    first: usize,
    exp: ExpKind,
    states: &mut [RowState],
) {
    const LOG2_CODES: f32 = 6.894_818; // log2(119) rounded to f32 (the kernel's constant)
    let (rows, n) = (q.rows, k.rows);
    if n == 0 {
        return;
    }
    let d = q.codes.len() / rows.max(1);
    let dv = v.codes.len() / n;
    let alpha = (q.scale * k.scale) * softmax_scale;
    let log2e = std::f32::consts::LOG2_E;
    let n_r = match exp {
        ExpKind::Sas(n_r) => n_r as f32,
        ExpKind::Exact => f32::NEG_INFINITY,
    };
    let mut dots = vec![0i32; n];
    let mut acc = vec![0i32; dv];
    for (i, st) in states.iter_mut().enumerate().take(rows) {
        let vis = visible[i].saturating_sub(first).min(n);
        if vis == 0 {
            continue;
        }
        let qi = &q.codes[i * d..(i + 1) * d];
        for (j, dj) in dots.iter_mut().enumerate().take(vis) {
            let kj = &k.codes[j * d..(j + 1) * d];
            *dj = qi.iter().zip(kj).map(|(&a, &b)| a as i32 * b as i32).sum();
        }
        let dmax = *dots[..vis].iter().max().expect("vis > 0") as f32;
        let tmax = dmax * alpha;
        let m_new = st.m.max(tmax);
        let dm = st.m - m_new; // -inf on the row's first tile
        let r = if dm >= n_r { (dm * log2e).exp2() } else { 0.0 };
        let a = alpha * log2e;
        let b = (-dmax).mul_add(a, LOG2_CODES);
        let thr = ((m_new - tmax) + n_r).mul_add(log2e, LOG2_CODES);
        acc.iter_mut().for_each(|x| *x = 0);
        let mut rowsum = 0i32;
        for (j, &dj) in dots.iter().enumerate().take(vis) {
            let arg = (dj as f32).mul_add(a, b);
            if arg < thr {
                continue;
            }
            let code = rne(arg.exp2()) as i32;
            if code == 0 {
                continue;
            }
            rowsum += code;
            for (x, &vc) in acc.iter_mut().zip(&v.codes[j * dv..(j + 1) * dv]) {
                *x += code * vc as i32;
            }
        }
        let s_p = ((tmax - m_new) * log2e).exp2() * (1.0 / INT8_DIVISOR);
        let c_pv = s_p * v.scale;
        st.l = (rowsum as f32).mul_add(s_p, st.l * r);
        for (o, &x) in st.acc.iter_mut().zip(&acc) {
            *o = (x as f32).mul_add(c_pv, *o * r);
        }
        st.m = m_new;
    }
}

/// INT8 K and V blocks of `B_c` tokens (the last one partial) of sequence `b`, KV head `h`.
fn kv_blocks(
    k: &Tensor,
    v: &Tensor,
    b: usize,
    h: usize,
    n: usize,
    bc: usize,
) -> Vec<(Int8Block, Int8Block)> {
    (0..n.div_ceil(bc))
        .map(|j| {
            let range = j * bc..((j + 1) * bc).min(n);
            let kr: Vec<&[f32]> = range.clone().map(|t| k.row4(b, t, h)).collect();
            let vr: Vec<&[f32]> = range.map(|t| v.row4(b, t, h)).collect();
            (Int8Block::quantize(&kr), Int8Block::quantize(&vr))
        })
        .collect()
}

/// Alg. 1 for the listed sequences; writes their rows of `o` (`[B, Sq, Hq, Dv]`) and `lse`
/// (`[B, Hq, Sq]`), rounding O to the problem's dtype.
#[allow(clippy::too_many_arguments)] // the prefill's operands and the INT32 path's headroom (round 14)
pub(crate) fn prefill_into(
    cfg: &TurboConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
    seqs: &[usize],
    pq: PQuant,
    headroom: i32,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let v = x.v.as_ref().expect("validated: separate K and V");
    let (hq, dv, sq_max) = (p.heads_q, p.head_dim_v, p.max_seqlen_q);
    let group = p.group_size();
    let exp = cfg.exp_kind();
    let kv: Vec<Vec<Vec<(Int8Block, Int8Block)>>> = seqs
        .par_iter()
        .map(|&b| {
            (0..p.heads_kv)
                .map(|h| kv_blocks(&x.k, v, b, h, p.seqlens_k[b], cfg.block_k))
                .collect()
        })
        .collect();
    let results: Vec<(usize, usize, Vec<RowOut>)> = (0..seqs.len() * hq)
        .into_par_iter()
        .map(|t| {
            let (si, h) = (t / hq, t % hq);
            let b = seqs[si];
            let blocks = &kv[si][h / group];
            let sq = p.seqlens_q[b];
            let mut rows = Vec::with_capacity(sq);
            for r0 in (0..sq).step_by(cfg.block_q) {
                let r1 = (r0 + cfg.block_q).min(sq);
                let qr: Vec<&[f32]> = (r0..r1).map(|i| x.q.row4(b, i, h)).collect();
                let qb = Int8Block::quantize(&qr);
                let visible: Vec<usize> = (r0..r1).map(|i| p.visible_keys(b, i)).collect();
                let reach = visible.iter().copied().max().unwrap_or(0);
                let mut states = vec![RowState::new(dv); r1 - r0];
                match pq {
                    PQuant::PerTile => {
                        for (j, (kb, vb)) in blocks.iter().enumerate() {
                            let first = j * cfg.block_k;
                            if first >= reach {
                                break;
                            }
                            attend_tile(
                                &qb,
                                p.softmax_scale,
                                &visible,
                                kb,
                                vb,
                                first,
                                exp,
                                &mut states,
                            );
                        }
                    }
                    PQuant::FixedU8 => {
                        let nt = reach.div_ceil(cfg.block_k).min(blocks.len());
                        let vs: Vec<f32> = blocks.iter().map(|(_, vb)| vb.scale).collect();
                        let threshold = fixed_p_threshold(cfg);
                        // the INT32 path where the visited V scales allow it (round 7)
                        if let Some(unit) = fixed_p_int_scale(&vs[..nt], threshold.is_some()) {
                            let mut st = vec![IntRowState::new(dv); r1 - r0];
                            for (j, (kb, vb)) in blocks.iter().enumerate().take(nt) {
                                attend_tile_fixed_p_int_headroom(
                                    &qb,
                                    p.softmax_scale,
                                    &visible,
                                    kb,
                                    vb,
                                    j * cfg.block_k,
                                    unit,
                                    headroom,
                                    &mut st,
                                );
                            }
                            rows.extend(st.into_iter().map(|s| s.finish(unit.s_u)));
                            continue;
                        }
                        // else the chunks of one or two blocks of the fast contract
                        for (j, n) in fixed_p_chunks(&vs, nt, threshold.is_some()) {
                            let chunk: Vec<(&Int8Block, &Int8Block)> =
                                blocks[j..j + n].iter().map(|(k, v)| (k, v)).collect();
                            let firsts: Vec<usize> = (j..j + n).map(|b| b * cfg.block_k).collect();
                            attend_chunk_fixed_p(
                                &qb,
                                p.softmax_scale,
                                &visible,
                                &chunk,
                                &firsts,
                                threshold,
                                &mut states,
                            );
                        }
                    }
                }
                match pq {
                    PQuant::PerTile => rows.extend(states.iter().map(RowState::finish)),
                    PQuant::FixedU8 => rows.extend(states.iter().map(finish_fixed_p)),
                }
            }
            (b, h, rows)
        })
        .collect();
    for (b, h, rows) in results {
        for (i, (orow, l)) in rows.into_iter().enumerate() {
            let dst = ((b * sq_max + i) * hq + h) * dv;
            for (d, s) in o[dst..dst + dv].iter_mut().zip(orow) {
                *d = p.dtype.round(s);
            }
            lse[(b * hq + h) * sq_max + i] = l;
        }
    }
}

/// Alg. 2 for one query row of one sequence against KV head `h`'s tiles ([`attend_tile`], or
/// [`attend_tile_fast`] when `fast`).
pub(crate) fn decode_row(
    cfg: &TurboConfig,
    tiles: &(Vec<Int8Block>, Vec<Int8Block>),
    q: &[f32],
    softmax_scale: f32,
    dv: usize,
    fast: bool,
) -> (Vec<f32>, f32) {
    let step = if fast { attend_tile_fast } else { attend_tile };
    let qb = Int8Block::quantize(&[q]);
    let mut st = [RowState::new(dv)];
    let mut first = 0;
    let exp = cfg.exp_kind();
    let visible = [usize::MAX];
    for (kt, vt) in tiles.0.iter().zip(&tiles.1) {
        step(&qb, softmax_scale, &visible, kt, vt, first, exp, &mut st);
        first += kt.rows;
    }
    st[0].finish()
}

/// Alg. 2 for every query head of one sequence: `q(h)` gives head `h`'s query row (`fast`: the
/// fast contract's tile step, [`attend_tile_fast`]).
pub(crate) fn decode_seq<'a>(
    cfg: &TurboConfig,
    seq: &SeqCache,
    heads_q: usize,
    dv: usize,
    q: impl Fn(usize) -> &'a [f32] + Sync,
    softmax_scale: f32,
    fast: bool,
) -> Vec<RowOut> {
    let heads_kv = seq.k.len();
    let group = heads_q / heads_kv;
    // heads in parallel (a batch-1 decode has one sequence, so the callers' parallelism over
    // sequences alone left it on one thread); each row's arithmetic is unchanged
    let tiles: Vec<(Vec<Int8Block>, Vec<Int8Block>)> = (0..heads_kv)
        .into_par_iter()
        .map(|h| (seq.k[h].int8_tiles(), seq.v[h].int8_tiles()))
        .collect();
    (0..heads_q)
        .into_par_iter()
        .map(|h| decode_row(cfg, &tiles[h / group], q(h), softmax_scale, dv, fast))
        .collect()
}

/// TurboAttention prefill (Alg. 1) of every sequence, and the compressed cache of all its keys
/// and values (full blocks compressed at the per-head bit widths, the tail in the INT8 buffer).
///
/// Queries and keys may differ in length (bottom-right causal mask as the problem says).
pub fn prefill(
    cfg: &TurboConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<(AttentionOutput, TurboKvCache)> {
    super::check_inputs(cfg, p, x)?;
    let (mut o, mut lse) = output_buffers(p);
    let seqs: Vec<usize> = (0..p.batch).collect();
    prefill_into(
        cfg,
        p,
        x,
        &seqs,
        PQuant::PerTile,
        0,
        &mut o.data,
        &mut lse.data,
    );
    let v = x.v.as_ref().expect("checked: separate K and V");
    let cache = TurboKvCache::from_context(cfg, &x.k, v, &p.seqlens_k)?;
    Ok((
        AttentionOutput {
            o,
            lse,
            provenance: provenance(),
        },
        cache,
    ))
}

/// The SAS threshold the fast contract applies itself: `n_r` with SAS on and `n_r >= -5`; below
/// (`n_r <= -6`, the paper's -6 included) the u8 rounding of P is the cut (`x < -6.23`), and with
/// SAS off there is none.
pub fn fixed_p_threshold(cfg: &TurboConfig) -> Option<i32> {
    (cfg.sas && cfg.sas_threshold >= -5).then_some(cfg.sas_threshold)
}

/// How the query blocks of a prefill divide between the fast contract's paths (per query head
/// and query block, as [`prefill_fixed_p`] and `turbo_prefill_wgf_*` choose).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedPPaths {
    /// Query blocks (per query head).
    pub blocks: usize,
    /// Those with fewer than [`FIXED_P_INT_MIN_TILES`] visited blocks or a SAS threshold.
    pub short_or_threshold: usize,
    /// Those whose visited V scales are positive and within a factor 2 (round 7's INT32 path).
    pub within_2: usize,
    /// Those that take the INT32 path now ([`fixed_p_int_scale`]).
    pub int_path: usize,
    /// Of `int_path`, per `r` (`floor(log2(max / min))`) 0..=6.
    pub by_r: [usize; 7],
}

/// [`FixedPPaths`] of a prefill of `x` under `cfg` (no attention computed: the V block scales
/// only).
pub fn fixed_p_paths(cfg: &TurboConfig, p: &AttentionProblem, x: &AttentionInputs) -> FixedPPaths {
    let v = x.v.as_ref().expect("separate K and V");
    let threshold = fixed_p_threshold(cfg).is_some();
    let mut out = FixedPPaths::default();
    for b in 0..p.batch {
        let n = p.seqlens_k[b];
        let scales: Vec<Vec<f32>> = (0..p.heads_kv)
            .into_par_iter()
            .map(|h| {
                (0..n.div_ceil(cfg.block_k))
                    .map(|j| {
                        let r = j * cfg.block_k..((j + 1) * cfg.block_k).min(n);
                        super::quant::int8_scale(r.flat_map(|t| v.row4(b, t, h).iter()))
                    })
                    .collect()
            })
            .collect();
        for h in 0..p.heads_q {
            let vs = &scales[h / p.group_size()];
            for r0 in (0..p.seqlens_q[b]).step_by(cfg.block_q) {
                let r1 = (r0 + cfg.block_q).min(p.seqlens_q[b]);
                let reach = (r0..r1).map(|i| p.visible_keys(b, i)).max().unwrap_or(0);
                let nt = reach.div_ceil(cfg.block_k).min(vs.len());
                let vis = &vs[..nt];
                out.blocks += 1;
                if threshold || nt < FIXED_P_INT_MIN_TILES {
                    out.short_or_threshold += 1;
                    continue;
                }
                let lo = vis.iter().copied().fold(f32::INFINITY, f32::min);
                let hi = vis.iter().copied().fold(0.0f32, f32::max);
                if lo > 0.0 && 2.0 * lo >= hi {
                    out.within_2 += 1;
                }
                if let Some(u) = fixed_p_int_scale(vis, false) {
                    out.int_path += 1;
                    out.by_r[u.r as usize] += 1;
                }
            }
        }
    }
    out
}

/// TurboAttention prefill under the fast contract ([`PQuant::FixedU8`], [`attend_tile_fixed_p`]):
/// the CPU twin of `turbo_prefill_wgf_*`. Q, K and V are quantized as in [`prefill`]; only
/// the softmax and the quantization of P differ. Per query block, the INT32 path
/// ([`attend_tile_fixed_p_int`]) where [`fixed_p_int_scale`] allows it, else the chunks of one
/// or two blocks ([`attend_chunk_fixed_p`]). No cache (it is [`prefill`]'s, bit for bit).
pub fn prefill_fixed_p(
    cfg: &TurboConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    prefill_fixed_p_headroom(cfg, p, x, 0)
}

/// [`prefill_fixed_p`] with the INT32 path's headroom rule of
/// [`attend_tile_fixed_p_int_headroom`] (`headroom = 0`: the contract; an experiment of issue 11,
/// prefill round 14).
pub(crate) fn prefill_fixed_p_headroom(
    cfg: &TurboConfig,
    p: &AttentionProblem,
    x: &AttentionInputs,
    headroom: i32,
) -> Result<AttentionOutput> {
    super::check_inputs(cfg, p, x)?;
    let (mut o, mut lse) = output_buffers(p);
    let seqs: Vec<usize> = (0..p.batch).collect();
    prefill_into(
        cfg,
        p,
        x,
        &seqs,
        PQuant::FixedU8,
        headroom,
        &mut o.data,
        &mut lse.data,
    );
    Ok(AttentionOutput {
        o,
        lse,
        provenance: provenance(),
    })
}

/// TurboAttention decode (Alg. 2) of one query token per sequence against everything `cache`
/// holds. `q` is `[B, 1, Hq, D]`; O is `[B, 1, Hq, D]` in `q`'s dtype, LSE `[B, Hq, 1]`.
pub fn decode(
    cfg: &TurboConfig,
    cache: &TurboKvCache,
    q: &Tensor,
    softmax_scale: f32,
) -> Result<AttentionOutput> {
    decode_with(cfg, cache, q, softmax_scale, false)
}

/// [`decode`] under the fast contract of the CUDA decode ([`attend_tile_fast`]): the CPU model
/// of `Options::fast_turbo_decode`, for measuring that contract's accuracy.
pub fn decode_fast(
    cfg: &TurboConfig,
    cache: &TurboKvCache,
    q: &Tensor,
    softmax_scale: f32,
) -> Result<AttentionOutput> {
    decode_with(cfg, cache, q, softmax_scale, true)
}

fn decode_with(
    cfg: &TurboConfig,
    cache: &TurboKvCache,
    q: &Tensor,
    softmax_scale: f32,
    fast: bool,
) -> Result<AttentionOutput> {
    cfg.validate()?;
    check_decode_query(cache, q, softmax_scale)?;
    if cfg.block_k != cache.block_tokens {
        return Err(CoreError::InvalidPlan(format!(
            "config block_k {} differs from the cache's block of {} tokens",
            cfg.block_k, cache.block_tokens
        )));
    }
    let (batch, hq, d) = (q.shape[0], q.shape[2], q.shape[3]);
    let mut o = Tensor::zeros(&[batch, 1, hq, d], q.dtype);
    let mut lse = Tensor {
        shape: vec![batch, hq, 1],
        dtype: DType::F32,
        data: vec![f32::NEG_INFINITY; batch * hq],
    };
    let per_seq: Vec<Vec<RowOut>> = (0..batch)
        .into_par_iter()
        .map(|b| {
            decode_seq(
                cfg,
                &cache.seqs[b],
                hq,
                d,
                |h| q.row4(b, 0, h),
                softmax_scale,
                fast,
            )
        })
        .collect();
    for (b, rows) in per_seq.into_iter().enumerate() {
        for (h, (orow, l)) in rows.into_iter().enumerate() {
            for (dst, s) in o.row4_mut(b, 0, h).iter_mut().zip(orow) {
                *dst = q.dtype.round(s);
            }
            lse.data[b * hq + h] = l;
        }
    }
    Ok(AttentionOutput {
        o,
        lse,
        provenance: provenance(),
    })
}

/// One decode step: appends `k_new`, `v_new` (`[B, 1, Hk, D]`) to the cache (flushing full
/// buffers), then runs [`decode`] for `q` (`[B, 1, Hq, D]`), which thus sees its own token.
pub fn decode_step(
    cfg: &TurboConfig,
    cache: &mut TurboKvCache,
    q: &Tensor,
    k_new: &Tensor,
    v_new: &Tensor,
    softmax_scale: f32,
) -> Result<AttentionOutput> {
    cfg.validate()?;
    check_decode_query(cache, q, softmax_scale)?;
    cache.append(k_new, v_new)?;
    decode(cfg, cache, q, softmax_scale)
}

fn check_decode_query(cache: &TurboKvCache, q: &Tensor, softmax_scale: f32) -> Result<()> {
    let ok = q.shape.len() == 4
        && q.shape[0] == cache.batch()
        && q.shape[1] == 1
        && q.shape[2].checked_rem(cache.heads_kv) == Some(0)
        && q.shape[2] > 0
        && q.shape[3] == cache.head_dim;
    if !ok {
        return Err(CoreError::Shape {
            tensor: "q",
            actual: q.shape.clone(),
            expected: format!(
                "[{}, 1, heads_q, {}] with heads_q a positive multiple of the cache's {} KV heads",
                cache.batch(),
                cache.head_dim,
                cache.heads_kv
            ),
        });
    }
    if !softmax_scale.is_finite() || softmax_scale <= 0.0 {
        return Err(CoreError::BadLength {
            what: "softmax_scale".into(),
            value: softmax_scale as i64,
            requirement: format!("finite and positive (got {softmax_scale})"),
        });
    }
    q.check_data("q")?;
    super::check_values("q", &q.data)?;
    Ok(())
}

/// Zeroed O and `-inf` LSE of the problem's shapes.
pub(crate) fn output_buffers(p: &AttentionProblem) -> (Tensor, Tensor) {
    let o = Tensor::zeros(&[p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v], p.dtype);
    let lse = Tensor {
        shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
        dtype: DType::F32,
        data: vec![f32::NEG_INFINITY; p.batch * p.heads_q * p.max_seqlen_q],
    };
    (o, lse)
}

pub(crate) fn provenance() -> Provenance {
    Provenance {
        device: "TurboAttention CPU emulation (INT8 + SAS)".into(),
        ..Provenance::cpu()
    }
}
