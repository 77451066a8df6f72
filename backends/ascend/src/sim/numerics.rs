//! The AMLA kernel's numerics, executed on the CPU in the kernel's order (AMLA Algorithm 2).
//!
//! What the kernel in `ascend-kernels/amla/amla_decode.cpp` does, step for step, in one of two
//! orders of arithmetic ([`Arithmetic`]): the core emulation's (the backend's simulated path,
//! equal to the CPU backend bit for bit) or the kernel's own with the semantics of the CPU model
//! of the AscendC API (`ascend-kernels/include/ascendc_decls.h`), against which the test
//! `kernel_cpu` checks the kernel itself bit for bit. The steps below name the kernel's order.
//!
//! * One Cube core (with its two Vector cores) owns whole sequences; a sequence's `M = Sq x Hq`
//!   query rows form one tile (row `r = token * Hq + head`), its KV is walked in blocks of
//!   `block_k` (512) tokens.
//! * The stages run in the order of the plan's Preload Pipeline ([`PreloadPipeline::cycles`]):
//!   for AMLA `C1(0) | C1(1) V1(0) | C2(t) C1(t+2) V1(t+1) ... | drain`, then the final
//!   normalisation ("Last [V]", section 4.1.3).
//! * `[C1]` `S = Q K^T`: BF16 operands, FP32 accumulation in increasing k (the model's `Mmad`
//!   order; the Cube's own order inside a fractal is not public), written to a GM workspace.
//! * `[V1]` (Alg. 2 lines 7-14): scale, running max, `n_i = round(-m_i log2(e))` (rounded half
//!   away from zero, `CAST_ROUND`), `P = exp(S - m)`, `l` (the row sum in the kernel's order, see
//!   [`RowSumOrder`]), `S32 = exp((n + m log2(e)) ln 2)`, `S16 = BF16(S32)` (`CAST_ROUND`, as the
//!   official AMLA kernels), the compensation `c_i = S16 / S32` (Appendix A's `r_i / r'_i`; line
//!   11 as printed has the reciprocal, which applies the correction with the wrong sign),
//!   `P <- BF16(P S16)` (`CAST_RINT`) to the workspace, and lines 15-17: one `AtomicAdd<INT32>`
//!   of `Cast_to_int32((max(n_i - n_{i-1}, -30) + eps + 1e-6) 2^23)` (`CAST_ROUND`) on every FP32
//!   word of the row of O in GM. The add is raw INT32 arithmetic on the bit pattern, as the
//!   hardware does it (Lemma 3.1 assumes normal numbers; an O entry that is exactly zero would
//!   not stay zero, see `docs/ASCEND.md`).
//! * `[C2]` `O_i = P V`: BF16 operands, FP32 accumulation in increasing token order, added to O
//!   in GM with `AtomicAdd<FP32>` (line 20) by FixP.
//! * Last `[V]`: `O / (l_N S16_N)` (line 22), cast to the output dtype; `LSE = m_N + ln l_N`.
//!
//! The Vector core's INT32 rescale for block `t` waits until `[C2]` of block `t - 1` has added
//! into O (a cross-core flag in the kernel; not a dependency of the paper's chain, and free in
//! the constructed cycle, which issues `[C2]` first on the Cube core).
//!
//! Rows whose causal window ends before a block are left untouched by that block (their `N` is
//! 0 and their P row is zero), so every row sees exactly the blocks that hold its visible keys.
//!
//! `Arithmetic::Kernel` differs from `ferrattn_core::amla::emulate` in the dot products
//! (sequential, not 8 interleaved partial sums), the row sum (the kernel's tree, not sequential)
//! and the tie rule of `S16`, `n` and `N` (`CAST_ROUND`, not to even): on 49152 outputs of a test
//! problem 123 BF16 values move by at most one ulp of the largest output and the LSE by 1e-6
//! (test `kernel_cpu::orders_differ_by_rounding_only`). `Arithmetic::CoreEmulation` has none of
//! these differences. In both, the INT32 add is raw (the emulation guards zero, subnormal and
//! out-of-range exponents); on data whose O entries are normal numbers that changes nothing.

use ferrattn_core::amla::preload::PreloadPipeline;
use ferrattn_core::dtype::to_bf16;
use ferrattn_core::{AttentionInputs, AttentionProblem, DType, Tensor};
use rayon::prelude::*;
use std::f32::consts::{LN_2, LOG2_E};

/// `2^23`: one unit of the FP32 exponent field read as an INT32 (Eq. 6).
const EXPONENT_UNIT: f32 = (1u32 << 23) as f32;

/// O (FP32, before the output cast) `[B, Sq, Hq, Dv]` and LSE `[B, Hq, Sq]`.
pub struct SimOutput {
    /// Normalised O in FP32.
    pub o: Vec<f32>,
    /// Natural-log LSE, `-inf` for rows without keys.
    pub lse: Vec<f32>,
}

/// Settings of the simulated kernel taken from the plan.
#[derive(Clone, Debug)]
pub struct KernelSettings {
    /// KV tokens per block.
    pub block_k: usize,
    /// Appendix A compensation on (`c_i = S16 / S32`) or off (`c_i = 1`).
    pub compensation: bool,
    /// Stage order.
    pub preload: PreloadPipeline,
    /// Whose order of arithmetic: the core emulation's or the kernel's.
    pub arithmetic: Arithmetic,
}

/// The order and rounding of the steps where the core emulation and the AscendC kernel differ.
///
/// Both compute Algorithm 2 with the same BF16 operands, `n_i` rule, INT32 rescale and
/// compensation; they differ in the FP32 rounding of the dot products and of the row sum and in
/// the tie rule of three casts, so their outputs agree to about one BF16 ulp, not bit for bit
/// (test `kernel_cpu::orders_differ_by_rounding_only`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arithmetic {
    /// `ferrattn_core::amla::emulate`'s order: dot products in 8 interleaved partial sums, the
    /// row sum in sequence, `n = round(-m / ln 2)`, `S16` and `N` rounded to nearest even. The
    /// backend's simulated path uses it, so it equals the CPU backend bit for bit
    /// (`tests/parity.rs`).
    #[default]
    CoreEmulation,
    /// `ascend-kernels/amla/amla_decode.cpp` on the CPU model of the AscendC API: dot products in
    /// increasing k (the model's `Mmad`), the row sum in the kernel's tree, `n = round(-m log2 e)`,
    /// `S16`, `n` and `N` rounded half away from zero (`CAST_ROUND`, as the official kernels). Test
    /// `kernel_cpu` checks the kernel against it bit for bit.
    Kernel(RowSumOrder),
}

/// FP32 dot product of BF16-valued rows in the order of [`Arithmetic`].
#[inline]
fn dot_f32(a: &[f32], b: &[f32], arith: Arithmetic) -> f32 {
    match arith {
        // the core emulation: 8 interleaved partial sums
        Arithmetic::CoreEmulation => {
            let mut acc = [0.0f32; 8];
            let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
            let (ra, rb) = (ca.remainder(), cb.remainder());
            for (x, y) in ca.zip(cb) {
                for l in 0..8 {
                    acc[l] += x[l] * y[l];
                }
            }
            let mut tail = 0.0f32;
            for (x, y) in ra.iter().zip(rb) {
                tail += x * y;
            }
            ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
        }
        // the CPU model's Mmad: one FP32 add per product in increasing k, the accumulator
        // carried in L0C across the baseK steps (the real Cube's order inside a fractal is not
        // public)
        Arithmetic::Kernel(_) => {
            let mut acc = 0.0f32;
            for (x, y) in a.iter().zip(b) {
                acc += x * y;
            }
            acc
        }
    }
}

/// Order in which the vector core adds a row of `exp(S - m)` (`[V1]`, line 8).
///
/// The kernel folds the 512 columns in halves (`x[i] + x[i + 256]`, then 128, 64: one vector
/// instruction over all rows each) and adds the last 64 with one `WholeReduceSum` per row, whose
/// internal order the AscendC docs leave open; both readings are modelled and tested.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowSumOrder {
    /// `WholeReduceSum` halves too: the whole sum is one halving tree.
    #[default]
    Halving,
    /// `WholeReduceSum` adds adjacent pairs (`x[2i] + x[2i + 1]`, ...).
    AdjacentPairs,
}

/// One vector repeat of FP32 (256 bytes): where the folds stop and `WholeReduceSum` starts.
const REPEAT_F32: usize = 64;

/// Row sum of `p` (`block_k` values, zeros past the visible keys) in the kernel's order.
fn row_sum(p: &[f32], order: RowSumOrder) -> f32 {
    let mut v = p.to_vec();
    v.resize(p.len().next_power_of_two().max(REPEAT_F32), 0.0);
    let mut len = v.len();
    while len > REPEAT_F32 {
        len /= 2;
        for i in 0..len {
            v[i] += v[i + len];
        }
    }
    while len > 1 {
        len /= 2;
        for i in 0..len {
            v[i] = match order {
                RowSumOrder::Halving => v[i] + v[i + len],
                RowSumOrder::AdjacentPairs => v[2 * i] + v[2 * i + 1],
            };
        }
    }
    v[0]
}

/// BF16 rounding to nearest with ties away from zero (`Cast` with `CAST_ROUND`), which the
/// kernel uses for `S16` as the official AMLA kernels do.
fn bf16_round_half_away(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    f32::from_bits((x.to_bits().wrapping_add(0x8000)) & 0xFFFF_0000)
}

/// Per-row softmax state kept in the Vector core's UB across blocks.
#[derive(Clone)]
struct RowState {
    m: f32,
    l: f32,
    n: i32,
    c: f32,
    s16: f32,
    started: bool,
}

/// One sequence's tile: everything the Cube/Vector pair holds or writes for it.
struct Tile<'a> {
    q: Vec<f32>,        // [rows, dk] BF16 values
    kv: &'a [f32],      // [sk, dk] BF16 values of this sequence
    ends: Vec<usize>,   // visible keys per row
    s: Vec<Vec<f32>>,   // GM workspace: S of each block, [rows, block_k]
    p: Vec<Vec<f32>>,   // GM workspace: BF16 P of each block, [rows, block_k]
    o_bits: Vec<u32>,   // O in GM, [rows, dv], FP32 bit patterns
    c2_done: Vec<bool>, // [C2] of each block has added into O
    state: Vec<RowState>,
}

/// Runs the simulated kernel over a validated MLA problem.
pub fn run(p: &AttentionProblem, x: &AttentionInputs, k: &KernelSettings) -> SimOutput {
    let (sq, sk, hq, dk, dv) = (
        p.max_seqlen_q,
        p.max_seqlen_k,
        p.heads_q,
        p.head_dim_qk,
        p.head_dim_v,
    );
    let q_bf: Vec<f32> = x.q.data.par_iter().map(|&v| to_bf16(v)).collect();
    let kv_bf: Vec<f32> = x.k.data.par_iter().map(|&v| to_bf16(v)).collect();
    let per_seq: Vec<(Vec<f32>, Vec<f32>)> = (0..p.batch)
        .into_par_iter()
        .map(|b| {
            let rows = p.seqlens_q[b] * hq;
            let ends: Vec<usize> = (0..rows).map(|r| p.visible_keys(b, r / hq)).collect();
            let seq_end = ends.iter().copied().max().unwrap_or(0);
            let q0 = b * sq * hq * dk;
            let mut tile = Tile {
                q: q_bf[q0..q0 + rows * dk].to_vec(),
                kv: &kv_bf[b * sk * dk..(b + 1) * sk * dk],
                ends,
                s: Vec::new(),
                p: Vec::new(),
                o_bits: vec![0u32; rows * dv], // O = 0 (line 3)
                c2_done: Vec::new(),
                state: vec![
                    RowState {
                        m: f32::NEG_INFINITY,
                        l: 0.0,
                        n: 0,
                        c: 1.0,
                        s16: 1.0,
                        started: false
                    };
                    rows
                ],
            };
            let blocks = seq_end.div_ceil(k.block_k);
            tile.s = vec![Vec::new(); blocks];
            tile.p = vec![Vec::new(); blocks];
            tile.c2_done = vec![false; blocks];
            // Each core runs its own stages in cycle order; a stage waits for its input, as the
            // cross-core flags make it wait on the device (S for [V1], P for [C2]).
            let cycles = k.preload.cycles(blocks);
            let cube: Vec<_> = cycles.iter().flat_map(|c| c.cube.iter().copied()).collect();
            let vector: Vec<_> = cycles
                .iter()
                .flat_map(|c| c.vector.iter().copied())
                .collect();
            let (mut ic, mut iv) = (0, 0);
            while ic < cube.len() || iv < vector.len() {
                let mut progressed = false;
                if let Some(op) = cube.get(ic) {
                    let ready = op.stage == 1 || !tile.p[op.block].is_empty();
                    if ready {
                        match op.stage {
                            1 => c1(&mut tile, op.block, k, dk),
                            _ => c2(&mut tile, op.block, k, dk, dv),
                        }
                        ic += 1;
                        progressed = true;
                    }
                }
                if let Some(op) = vector.get(iv) {
                    // [V2] = 0 in AMLA (section 4.1.3): it waits for nothing and does nothing.
                    // [V1]'s INT32 rescale must see the previous block's [C2] sum in GM.
                    let ready = op.stage == 2
                        || (!tile.s[op.block].is_empty()
                            && (op.block == 0 || tile.c2_done[op.block - 1]));
                    if ready {
                        if op.stage == 1 {
                            v1(&mut tile, op.block, k, p.softmax_scale, dv);
                        }
                        iv += 1;
                        progressed = true;
                    }
                }
                assert!(
                    progressed,
                    "the plan's Preload Pipeline deadlocks (checked by PreloadPipeline::check)"
                );
            }
            last_v(&tile, rows, dv, sq, hq)
        })
        .collect();
    let mut o = vec![0.0f32; p.batch * sq * hq * dv];
    let mut lse = vec![f32::NEG_INFINITY; p.batch * hq * sq];
    for (b, (ob, lb)) in per_seq.into_iter().enumerate() {
        o[b * sq * hq * dv..b * sq * hq * dv + ob.len()].copy_from_slice(&ob);
        lse[b * hq * sq..(b + 1) * hq * sq].copy_from_slice(&lb);
    }
    SimOutput { o, lse }
}

/// `[C1]` (line 6): `S = Q K_t^T`, FP32, to the workspace.
fn c1(t: &mut Tile, blk: usize, k: &KernelSettings, dk: usize) {
    let start = blk * k.block_k;
    let rows = t.ends.len();
    let mut s = vec![f32::NEG_INFINITY; rows * k.block_k];
    for r in 0..rows {
        let q = &t.q[r * dk..(r + 1) * dk];
        let stop = t.ends[r].min(start + k.block_k);
        for j in start..stop {
            s[r * k.block_k + j - start] = dot_f32(q, &t.kv[j * dk..(j + 1) * dk], k.arithmetic);
        }
    }
    t.s[blk] = s;
}

/// `[V1]` (lines 7-17) for block `blk`.
fn v1(t: &mut Tile, blk: usize, k: &KernelSettings, scale: f32, dv: usize) {
    let start = blk * k.block_k;
    let bk = k.block_k;
    let s = std::mem::take(&mut t.s[blk]);
    let rows = t.ends.len();
    let mut pbuf = vec![0.0f32; rows * bk];
    for r in 0..rows {
        let stop = t.ends[r].min(start + bk);
        if stop <= start {
            continue; // no visible key of this row in the block: N = 0, P = 0
        }
        let w = stop - start;
        let st = &mut t.state[r];
        let row = &s[r * bk..r * bk + w];
        let p = &mut pbuf[r * bk..r * bk + w];
        // line 7: S = S / sqrt(Dk); m_i = max(m_{i-1}, rowmax S); M_up = exp(m_{i-1} - m_i)
        for (pj, &sj) in p.iter_mut().zip(row) {
            *pj = sj * scale;
        }
        let m_new = p.iter().copied().fold(st.m, f32::max);
        let m_up = (st.m - m_new).exp();
        // line 8: n_i, P = exp(S - m_i), l_i = l_{i-1} M_up + rowsum P
        for pj in p.iter_mut() {
            *pj = (*pj - m_new).exp();
        }
        let (rowsum, n, s32, s16) = match k.arithmetic {
            Arithmetic::CoreEmulation => {
                let rowsum = p.iter().fold(0.0f32, |a, &x| a + x);
                let n = (-m_new / LN_2).round() as i32;
                // lines 9-10: S32 = 2^n e^m, S16 = BF16(S32)
                let s32 = (LN_2 * (n as f32 + m_new / LN_2)).exp();
                (rowsum, n, s32, to_bf16(s32))
            }
            Arithmetic::Kernel(order) => {
                // the kernel sums all block_k columns, masked ones being exp(-inf) = 0
                let mut padded = vec![0.0f32; bk];
                padded[..w].copy_from_slice(p);
                let rowsum = row_sum(&padded, order);
                // n = round(-m / ln 2) as -m x log2(e), half away from zero (CAST_ROUND)
                let n = (-m_new * LOG2_E).round() as i32;
                let s32 = ((n as f32 + m_new * LOG2_E) * LN_2).exp();
                (rowsum, n, s32, bf16_round_half_away(s32))
            }
        };
        st.l = st.l * m_up + rowsum;
        // line 11: c_i = S16 / S32, eps = 1.5 (c_i / c_{i-1} - 1)
        let c = if k.compensation { s16 / s32 } else { 1.0 };
        let eps = 1.5 * (c / st.c - 1.0);
        // line 12: P = BF16(P S16)
        for pj in p.iter_mut() {
            *pj = to_bf16(*pj * s16);
        }
        // lines 13-17: AtomicAdd<INT32> of N on the row of O in GM (not for the first block)
        if st.started {
            let nf = (n - st.n).max(-30) as f32 + eps + 1e-6;
            let delta = match k.arithmetic {
                Arithmetic::CoreEmulation => (nf * EXPONENT_UNIT).round_ties_even() as i32,
                // CAST_ROUND (ties away from zero), as the official kernels cast N
                Arithmetic::Kernel(_) => (nf * EXPONENT_UNIT).round() as i32,
            };
            for w in &mut t.o_bits[r * dv..(r + 1) * dv] {
                *w = (*w as i32).wrapping_add(delta) as u32;
            }
        }
        *st = RowState {
            m: m_new,
            l: st.l,
            n,
            c,
            s16,
            started: true,
        };
    }
    t.p[blk] = pbuf;
}

/// `[C2]` (lines 19-20): `O_t = P V_t` in FP32, `AtomicAdd<FP32>` into O.
fn c2(t: &mut Tile, blk: usize, k: &KernelSettings, dk: usize, dv: usize) {
    let start = blk * k.block_k;
    let bk = k.block_k;
    let p = std::mem::take(&mut t.p[blk]);
    t.c2_done[blk] = true;
    let mut acc = vec![0.0f32; dv];
    for r in 0..t.ends.len() {
        let stop = t.ends[r].min(start + bk);
        if stop <= start {
            continue;
        }
        acc.fill(0.0);
        for j in start..stop {
            let pj = p[r * bk + j - start];
            let v = &t.kv[j * dk..j * dk + dv];
            for (a, &x) in acc.iter_mut().zip(v) {
                *a += pj * x;
            }
        }
        for (w, &a) in t.o_bits[r * dv..(r + 1) * dv].iter_mut().zip(&acc) {
            *w = (f32::from_bits(*w) + a).to_bits();
        }
    }
}

/// Last `[V]` (line 22): normalise, lay out as `[Sq, Hq, Dv]` and `[Hq, Sq]`.
fn last_v(t: &Tile, rows: usize, dv: usize, sq: usize, hq: usize) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![0.0f32; sq * hq * dv];
    let mut lse = vec![f32::NEG_INFINITY; hq * sq];
    for r in 0..rows {
        let st = &t.state[r];
        if !st.started {
            continue;
        }
        let denom = st.l * st.s16;
        for (dst, &w) in o[r * dv..(r + 1) * dv]
            .iter_mut()
            .zip(&t.o_bits[r * dv..(r + 1) * dv])
        {
            *dst = f32::from_bits(w) / denom;
        }
        let (i, h) = (r / hq, r % hq);
        lse[h * sq + i] = st.m + st.l.ln();
    }
    (o, lse)
}

/// Packs a [`SimOutput`] as the problem's O and LSE tensors.
pub fn to_tensors(p: &AttentionProblem, s: SimOutput) -> (Tensor, Tensor) {
    let o = Tensor {
        shape: vec![p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v],
        dtype: p.dtype,
        data: s.o.into_iter().map(|v| p.dtype.round(v)).collect(),
    };
    let lse = Tensor {
        shape: vec![p.batch, p.heads_q, p.max_seqlen_q],
        dtype: DType::F32,
        data: s.lse,
    };
    (o, lse)
}
