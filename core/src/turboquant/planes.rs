//! 2-bit codes as two bit planes: the arithmetic contract of a decode on INT8 tensor cores
//! (issue 10, `docs/TURBOQUANT_CUDA.md`, "Decode: 2-bit codes as bit planes, the CPU half").
//!
//! A 2-bit Lloyd-Max codebook is exactly symmetric, `{-b, -a, a, b}` in index order (see
//! [`codebook`](mod@super::codebook)), so its value is affine in the index's two bits: with
//! `s = idx >> 1` (the sign plane) and `m = idx & 1` (the magnitude plane),
//! `c(s, m) = -b + (a + b) s + (b - a) m` ([`Affine2`]). An inner product with codes then needs no
//! table: `<x, c[idx]> = -b Σx + (a + b) <x, s> + (b - a) <x, m>`, two products with 0/1
//! operands. The QJL signs are one such plane: `<x, ±1> = 2 <x, σ> - Σx` with `σ` the sign bit.
//!
//! On a GPU the 0/1 planes are `s8` operands of `mma.m16n8k32.s8` (a plane bit moved to bit 7 of
//! a byte, `-128` per set bit: one uniform factor) and the other operand must be INT8 too:
//! [`PlaneOperands::INT8`] quantizes the rotated query `Π q`, the projected query `S q` and each
//! 16-token stage's `p ‖v‖` (the P·V operand) per row to INT8 with a scale `max |x| / 127` and
//! round-to-nearest-even, takes the plane products and `Σx` as exact integer sums, and combines
//! them in `f32`: `score = ‖k‖ σ_q (c₀ Σq₈ + c_s <q₈, s> + c_m <q₈, m>)` (+ the QJL term),
//! `acc += σ_p (c₀ Σp₈ + c_s <p₈, s> + c_m <p₈, m>)` per value coordinate, in the rotated basis
//! (un-rotated once per row at the end). The softmax's `l` sums the unquantized `p` (the kernel's
//! `l` is an `f32` sum of its `exp2`). [`PlaneOperands::F32`] keeps every operand in `f32`: the
//! same algebra as the lookup, which the tests use to show the plane path is the emulation's
//! arithmetic up to `f32` rounding.
//!
//! Only the 2-bit codebooks are affine in their bits (4 magnitudes of a 3-bit codebook are not);
//! keys or values with another width take the lookup path here, as they would in a kernel.
//! Stages are [`PLANE_STAGE`] tokens, the CUDA decode loop's `kTileK`, with the kernel's online
//! softmax order (the stage's max first, then `p = exp(s - m_new)`).

use super::attention::{assemble_output, CompressedKv, RowOut, TurboQuantCodec};
use super::codebook::Codebook;
use crate::{AttentionOutput, AttentionProblem, DType, SoftmaxState, Tensor};
use rayon::prelude::*;

/// Tokens per online-softmax stage (the CUDA decode loop's `kTileK`): the granularity of the
/// per-row INT8 scale of `p ‖v‖`.
pub const PLANE_STAGE: usize = 16;

/// Tokens sharing P's scale under [`Operand::Int8TileNorm`] (the CUDA decode's 64-token tile).
pub const PLANE_TILE: usize = 64;

/// The largest INT8 magnitude used: scales are `max |x| / 127`, so `-128` never appears (the
/// operand stays symmetric).
pub const INT8_MAX: f32 = 127.0;

/// How one operand of the plane products is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    /// Per-row INT8: scale `max |x| / 127`, round-to-nearest-even, exact integer sums.
    Int8,
    /// Two per-row INT8 operands, `x ≈ scale (hi + lo / 254)`: `hi` as [`Operand::Int8`], `lo`
    /// the rounding residual (at most half a step) at 254 steps a step. Free on the MMA at up to
    /// 8 query rows: the CUDA decode already stacks the query's f16 hi and lo halves on MMA rows
    /// 0-7 and 8-15 (`score_word`), and an s8 MMA's rows 8-15 can hold `lo` the same way.
    Int8HiLo,
    /// For P only: INT8 with one scale for every row and stage of a [`PLANE_TILE`]-token tile,
    /// `max ‖v‖ / 127` over the tile's tokens (`p <= 1` after the stage's max), so that a kernel
    /// can accumulate a tile's P·V in the MMA's s32 registers and fold them into the f32 O once
    /// a tile (and at a rescale) instead of once a stage. As [`Operand::Int8`] for the queries.
    Int8TileNorm,
    /// `f32` as computed (the lookup's arithmetic).
    F32,
}

/// The operands of the plane products: the queries (`Π q` and `S q`) and each stage's `p ‖v‖`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneOperands {
    /// `Π q` and `S q`, once per row and step.
    pub query: Operand,
    /// `p ‖v‖` of each [`PLANE_STAGE`]-token stage, per row.
    pub p: Operand,
}

impl PlaneOperands {
    /// The INT8 contract (module docs): queries and P in INT8.
    pub const INT8: PlaneOperands = PlaneOperands {
        query: Operand::Int8,
        p: Operand::Int8,
    };
    /// The INT8 contract with the queries as hi/lo INT8 pairs ([`Operand::Int8HiLo`]).
    pub const INT8_QUERY_HILO: PlaneOperands = PlaneOperands {
        query: Operand::Int8HiLo,
        p: Operand::Int8,
    };
    /// Every operand in `f32`: the lookup's arithmetic through the planes (tests).
    pub const F32: PlaneOperands = PlaneOperands {
        query: Operand::F32,
        p: Operand::F32,
    };
}

/// `c(s, m) = base + sign · s + magnitude · m`: a 2-bit codebook as an affine function of its
/// code's sign bit `s = idx >> 1` and magnitude bit `m = idx & 1`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Affine2 {
    /// `c₀ = -b`, the value of code 0.
    pub base: f32,
    /// `c₂ - c₀ = a + b`, the weight of the sign plane.
    pub sign: f32,
    /// `c₁ - c₀ = b - a`, the weight of the magnitude plane.
    pub magnitude: f32,
}

impl Affine2 {
    /// The affine form of `cb`, or `None` unless `cb` has 4 centroids with `c₃ - c₂ = c₁ - c₀`
    /// exactly (true of every symmetric codebook, which the Lloyd-Max ones are by construction).
    /// The identity is checked on the `f32` centroids in `f64`, where it is exact arithmetic.
    pub fn of(cb: &Codebook) -> Option<Affine2> {
        let c: Vec<f64> = cb.centroids_f32().iter().map(|&x| x as f64).collect();
        if c.len() != 4 || c[3] - c[2] != c[1] - c[0] {
            return None;
        }
        Some(Affine2 {
            base: c[0] as f32,
            sign: (c[2] - c[0]) as f32,
            magnitude: (c[1] - c[0]) as f32,
        })
    }

    /// The two planes of a 2-bit code: `(s, m)`.
    pub fn planes(idx: u8) -> (u8, u8) {
        (idx >> 1 & 1, idx & 1)
    }

    /// `base · Σx + sign · <x, s> + magnitude · <x, m>` from the three sums.
    pub fn combine(&self, sum: f32, sign_dot: f32, magnitude_dot: f32) -> f32 {
        self.base * sum + self.sign * sign_dot + self.magnitude * magnitude_dot
    }
}

/// A row as the plane products see it: `x ≈ scale · values` (exactly, for [`Operand::F32`],
/// whose values are `x` and scale 1).
#[derive(Clone, Debug, PartialEq)]
pub struct PlaneRow {
    /// The operand: INT8 integers (held as `f32`, exact) or the `f32` row itself.
    pub values: Vec<f32>,
    /// Factor that turns a product with `values` back into one with `x`.
    pub scale: f32,
    /// `Σ values` (an exact integer sum for INT8; `Σ hi + Σ lo / 254` for hi/lo).
    pub sum: f32,
    /// [`Operand::Int8HiLo`]'s `lo` integers (empty otherwise).
    pub lo: Vec<f32>,
}

/// Steps of `lo` per step of `hi` in [`Operand::Int8HiLo`] (`|lo| <= 127` for a residual of at
/// most half a step).
pub const LO_STEPS: f32 = 254.0;

impl PlaneRow {
    /// `x` as the operand of the plane products: per-row INT8 (scale `max |x| / 127`,
    /// round-to-nearest-even, a zero row stays zero with scale 0) or `f32`.
    pub fn new(x: &[f32], operand: Operand) -> PlaneRow {
        let (values, scale): (Vec<f32>, f32) = match operand {
            Operand::F32 => (x.to_vec(), 1.0),
            Operand::Int8 | Operand::Int8HiLo | Operand::Int8TileNorm => {
                let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                if amax == 0.0 {
                    (vec![0.0; x.len()], 0.0)
                } else {
                    let scale = amax / INT8_MAX;
                    let inv = INT8_MAX / amax;
                    let v = x
                        .iter()
                        .map(|&v| (v * inv).round_ties_even().clamp(-INT8_MAX, INT8_MAX))
                        .collect();
                    (v, scale)
                }
            }
        };
        let lo: Vec<f32> = match operand {
            Operand::Int8HiLo if scale > 0.0 => {
                let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let inv = INT8_MAX / amax;
                x.iter()
                    .zip(&values)
                    .map(|(&v, &h)| ((v * inv - h) * LO_STEPS).round_ties_even())
                    .collect()
            }
            Operand::Int8HiLo => vec![0.0; x.len()],
            _ => Vec::new(),
        };
        // integers below 2^24: the f32 sums are the exact integer sums
        let isum = |v: &[f32]| v.iter().map(|&v| v as i32).sum::<i32>() as f32;
        let sum = match operand {
            Operand::Int8 | Operand::Int8TileNorm => isum(&values),
            Operand::Int8HiLo => isum(&values) + isum(&lo) / LO_STEPS,
            Operand::F32 => values.iter().sum(),
        };
        PlaneRow {
            values,
            scale,
            sum,
            lo,
        }
    }

    /// `x` in INT8 at a given scale (`x / scale` at most 127 in magnitude; a scale of 0 gives
    /// zeros): [`Operand::Int8TileNorm`]'s P.
    pub fn with_scale(x: &[f32], scale: f32) -> PlaneRow {
        let values: Vec<f32> = if scale > 0.0 {
            x.iter()
                .map(|&v| (v / scale).round_ties_even().clamp(-INT8_MAX, INT8_MAX))
                .collect()
        } else {
            vec![0.0; x.len()]
        };
        let sum = values.iter().map(|&v| v as i32).sum::<i32>() as f32;
        PlaneRow {
            values,
            scale,
            sum,
            lo: Vec::new(),
        }
    }

    /// Entry `i` of the operand, unscaled (`hi + lo / 254` for hi/lo).
    fn value(&self, i: usize) -> f32 {
        match self.lo.get(i) {
            Some(&lo) => self.values[i] + lo / LO_STEPS,
            None => self.values[i],
        }
    }

    /// `<values, plane>` over a 0/1 plane given as one byte per coordinate (exact integer sums
    /// for INT8, one for `hi` and one for `lo` combined in `f32` for hi/lo).
    fn dot_plane(&self, plane: impl Iterator<Item = u8>) -> f32 {
        let (mut hi, mut lo) = (0.0f32, 0.0f32);
        for (i, bit) in plane.enumerate().take(self.values.len()) {
            if bit != 0 {
                hi += self.values[i];
                if let Some(&l) = self.lo.get(i) {
                    lo += l;
                }
            }
        }
        hi + lo / LO_STEPS
    }
}

/// One query row of a work item.
struct Row {
    head: usize,
    row: usize,
    q_rot: PlaneRow,
    q_proj: PlaneRow,
    /// `Π q` in `f32` for the lookup path (keys that are not 2-bit).
    q_rot_f32: Vec<f32>,
    end: usize,
    state: SoftmaxState,
}

/// Attention of `q` over the compressed cache with 2-bit keys and/or values taken through their
/// bit planes (module docs); the same step as [`TurboQuantCodec::attend`] otherwise. Keys whose
/// codebook is not 2-bit, and values likewise, take the lookup path in `f32`. `p` must describe
/// `q` and the cache; values are accumulated in the rotated basis and un-rotated once a row.
pub fn attend_planes(
    codec: &TurboQuantCodec,
    p: &AttentionProblem,
    q: &Tensor,
    kv: &CompressedKv,
    operands: PlaneOperands,
) -> AttentionOutput {
    let (hk, dk, dv) = (p.heads_kv, p.head_dim_qk, p.head_dim_v);
    let group = p.group_size();
    let m = codec.sketch().rows();
    let sb = codec.sketch().sign_bytes();
    let key_cb = codec.key.mse().codebook();
    let key_mse = codec.key.mse().bits() > 0;
    let key_affine = if key_mse { Affine2::of(key_cb) } else { None };
    let val_cb = codec.value.codebook();
    let val_affine = Affine2::of(val_cb);
    let scale = p.softmax_scale;
    let correction_scale = scale * codec.sketch().correction_scale();
    let pi_v = codec.value_rotation();
    let row_of = |b: usize, j: usize, h: usize| (b * kv.max_seqlen_k + j) * kv.heads_kv + h;

    let tiles: Vec<(usize, Vec<RowOut>)> = (0..p.batch * hk)
        .into_par_iter()
        .map(|t| {
            let (b, g) = (t / hk, t % hk);
            let sk = kv.seqlens_k[b];
            let mut rows: Vec<Row> = Vec::new();
            for h in g * group..(g + 1) * group {
                for i in 0..p.seqlens_q[b] {
                    let prep = codec.key.prepare_query(q.row4(b, i, h));
                    rows.push(Row {
                        head: h,
                        row: i,
                        q_rot: PlaneRow::new(&prep.rot, operands.query),
                        q_proj: PlaneRow::new(&prep.proj, operands.query),
                        q_rot_f32: prep.rot,
                        end: p.visible_keys(b, i).min(sk),
                        state: SoftmaxState::empty(dv),
                    });
                }
            }
            let last_end = rows.iter().map(|r| r.end).max().unwrap_or(0);
            let mut scores = [0.0f32; PLANE_STAGE];
            let mut pv = [0.0f32; PLANE_STAGE];
            let mut start = 0;
            while start < last_end {
                let n = PLANE_STAGE.min(sk - start);
                for r in rows.iter_mut() {
                    let vis = r.end.min(start + n).saturating_sub(start);
                    if vis == 0 {
                        continue;
                    }
                    // scores of the stage's visible keys
                    let mut mx = f32::NEG_INFINITY;
                    for (jj, s) in scores.iter_mut().enumerate().take(vis) {
                        let kr = row_of(b, start + jj, g);
                        let idx = &kv.k_idx[kr * dk..(kr + 1) * dk];
                        let term1 = match key_affine {
                            Some(af) => {
                                let ds = r.q_rot.dot_plane(idx.iter().map(|&c| c >> 1 & 1));
                                let dm = r.q_rot.dot_plane(idx.iter().map(|&c| c & 1));
                                kv.k_norm[kr] * r.q_rot.scale * af.combine(r.q_rot.sum, ds, dm)
                            }
                            None if key_mse => {
                                let dot: f32 = r
                                    .q_rot_f32
                                    .iter()
                                    .zip(idx)
                                    .map(|(a, &c)| a * key_cb.centroid(c))
                                    .sum();
                                kv.k_norm[kr] * dot
                            }
                            None => 0.0,
                        };
                        *s = if codec.key_qjl {
                            // <x, ±1> = 2 <x, σ> - Σx over the sign plane σ
                            let signs = &kv.k_signs[kr * sb..(kr + 1) * sb];
                            let bits = (0..m).map(|i| signs[i / 8] >> (i % 8) & 1);
                            let dsig = r.q_proj.dot_plane(bits);
                            let term2 = r.q_proj.scale * (2.0 * dsig - r.q_proj.sum);
                            term1 * scale + kv.r_norm[kr] * correction_scale * term2
                        } else {
                            term1 * scale
                        };
                        mx = mx.max(*s);
                    }
                    // online softmax, the kernel's order: new max, rescale, then p of the stage
                    let st = &mut r.state;
                    let m_new = st.m.max(mx);
                    st.rescale_to(m_new);
                    for jj in 0..vis {
                        let pj = (scores[jj] - m_new).exp();
                        st.l += pj;
                        pv[jj] = pj * kv.v_norm[row_of(b, start + jj, g)];
                    }
                    // P ‖v‖ · c[idx] in the rotated basis
                    let pr = if operands.p == Operand::Int8TileNorm {
                        let t0 = start / PLANE_TILE * PLANE_TILE;
                        let vmax = (t0..(t0 + PLANE_TILE).min(sk))
                            .map(|j| kv.v_norm[row_of(b, j, g)])
                            .fold(0.0f32, f32::max);
                        PlaneRow::with_scale(&pv[..vis], vmax / INT8_MAX)
                    } else {
                        PlaneRow::new(&pv[..vis], operands.p)
                    };
                    let vrow = |jj: usize| {
                        let vr = row_of(b, start + jj, g);
                        &kv.v_idx[vr * dv..(vr + 1) * dv]
                    };
                    match val_affine {
                        Some(af) => {
                            for (c, a) in st.acc.iter_mut().enumerate() {
                                let ds = pr.dot_plane((0..vis).map(|jj| vrow(jj)[c] >> 1 & 1));
                                let dm = pr.dot_plane((0..vis).map(|jj| vrow(jj)[c] & 1));
                                *a += pr.scale * af.combine(pr.sum, ds, dm);
                            }
                        }
                        None => {
                            for (c, a) in st.acc.iter_mut().enumerate() {
                                let dot: f32 = (0..vis)
                                    .map(|jj| pr.value(jj) * val_cb.centroid(vrow(jj)[c]))
                                    .sum();
                                *a += pr.scale * dot;
                            }
                        }
                    }
                }
                start += n;
            }
            let out = rows
                .into_iter()
                .map(|r| {
                    let (o, lse) = r.state.finish();
                    let mut un = vec![0.0f32; dv];
                    if lse != f32::NEG_INFINITY {
                        pi_v.apply_t(&o, &mut un);
                    }
                    (r.head, r.row, un, lse)
                })
                .collect();
            (b, out)
        })
        .collect();
    assemble_output(p, tiles)
}

/// One line of [`plane_accuracy_table`]: a 2-bit configuration, the emulation and the INT8 plane
/// contract against the `f64` golden, and the two against each other.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PlaneAccuracyRow {
    /// `k2 v2 mse-only` or `k3 v2 qjl` (the CUDA bench's k2-v2 and k3q-v2).
    pub setting: String,
    /// Head dim (keys and values).
    pub head_dim: usize,
    /// Keys of each sequence (the last 16 are the decode queries' causal window).
    pub seqlen_k: usize,
    /// Relative Frobenius error of O against the golden: the emulation ([`TurboQuantCodec::attend`]).
    pub emu_rel_fro: f64,
    /// The same for the INT8 plane path.
    pub planes_rel_fro: f64,
    /// Over the query heads of the KV heads with massive key channels: emulation, planes.
    pub outlier_heads: (f64, f64),
    /// Over the other query heads: emulation, planes.
    pub clean_heads: (f64, f64),
    /// Largest absolute LSE error against the golden: emulation, planes.
    pub lse_max_abs: (f64, f64),
    /// Relative Frobenius difference of the plane path's O from the emulation's.
    pub planes_vs_emu_rel_fro: f64,
    /// Largest absolute LSE difference of the plane path from the emulation.
    pub planes_vs_emu_lse_max_abs: f64,
    /// [`PlaneOperands::INT8_QUERY_HILO`]: O's relative Frobenius error and LSE's largest
    /// absolute error against the golden.
    pub hilo: (f64, f64),
    /// The same path against the emulation: O relative Frobenius, LSE max abs.
    pub hilo_vs_emu: (f64, f64),
    /// Queries hi/lo, P at one scale a tile ([`Operand::Int8TileNorm`]): O and LSE error against
    /// the golden.
    pub tile: (f64, f64),
    /// The same path against the emulation.
    pub tile_vs_emu: (f64, f64),
    /// The same two with only the queries in INT8 (P in `f32`).
    pub query_int8_vs_emu: (f64, f64),
    /// The same two with only P in INT8 (queries in `f32`).
    pub p_int8_vs_emu: (f64, f64),
    /// The same two with the planes' operands in `f32` (the algebra alone, no INT8).
    pub f32_planes_vs_emu: (f64, f64),
}

/// The 2-bit settings the plane form targets: (name, key bits, value bits, QJL).
pub const PLANE_SETTINGS: [(&str, u8, u8, bool); 2] =
    [("k2 v2 mse-only", 2, 2, false), ("k3 v2 qjl", 3, 2, true)];

/// The plane contract's accuracy on the inputs of [`super::accuracy::accuracy_table`]
/// (`turbo::llm_like_inputs`, 4 key channels at 10-50x in every other KV head, fp16, GQA 8/4,
/// 16 causal decode queries) at head dim `d` and `seqlen_k` keys: for each of
/// [`PLANE_SETTINGS`], the emulation's and the INT8 planes' error against the `f64` golden.
pub fn plane_accuracy_table(seed: u64, d: usize, seqlen_k: usize) -> Vec<PlaneAccuracyRow> {
    use super::accuracy::compare;
    use super::TurboQuantConfig;
    use crate::Comparison;
    let mut p = AttentionProblem::uniform(1, 16, seqlen_k, 8, 4, d, d, DType::F16);
    p.causal = true;
    let x = crate::turbo::llm_like_inputs(&p, seed ^ 0x5eed);
    let mut rows = Vec::new();
    for (name, kb, vb, qjl) in PLANE_SETTINGS {
        let cfg = TurboQuantConfig {
            key_bits: kb,
            value_bits: vb,
            key_qjl: qjl,
            ..TurboQuantConfig::paper_default(&p)
        };
        cfg.check(&p).expect("a supported configuration");
        let codec = TurboQuantCodec::new(&cfg, d, d);
        let kv = codec.compress(&p, &x);
        let emu = codec.attend(&cfg, &p, &x.q, &kv);
        let int8 = attend_planes(&codec, &p, &x.q, &kv, PlaneOperands::INT8);
        let f32p = attend_planes(&codec, &p, &x.q, &kv, PlaneOperands::F32);
        let q_only = PlaneOperands {
            query: Operand::Int8,
            p: Operand::F32,
        };
        let p_only = PlaneOperands {
            query: Operand::F32,
            p: Operand::Int8,
        };
        let q8 = attend_planes(&codec, &p, &x.q, &kv, q_only);
        let hl = attend_planes(&codec, &p, &x.q, &kv, PlaneOperands::INT8_QUERY_HILO);
        let (ch, lh, _, _) = compare(&p, &x, &hl.o.data, &hl.lse.data);
        let tile_ops = PlaneOperands {
            query: Operand::Int8HiLo,
            p: Operand::Int8TileNorm,
        };
        let tl = attend_planes(&codec, &p, &x.q, &kv, tile_ops);
        let (ct, lt, _, _) = compare(&p, &x, &tl.o.data, &tl.lse.data);
        let p8 = attend_planes(&codec, &p, &x.q, &kv, p_only);
        let (ce, le, oe, ke) = compare(&p, &x, &emu.o.data, &emu.lse.data);
        let (cp, lp, op, kp) = compare(&p, &x, &int8.o.data, &int8.lse.data);
        let vs = |a: &AttentionOutput| {
            (
                Comparison::f32(&emu.o.data, &a.o.data).rel_fro,
                Comparison::f32(&emu.lse.data, &a.lse.data).max_abs,
            )
        };
        let (d_o, d_l) = vs(&int8);
        rows.push(PlaneAccuracyRow {
            setting: name.into(),
            head_dim: d,
            seqlen_k,
            emu_rel_fro: ce.rel_fro,
            planes_rel_fro: cp.rel_fro,
            outlier_heads: (oe, op),
            clean_heads: (ke, kp),
            lse_max_abs: (le.max_abs, lp.max_abs),
            planes_vs_emu_rel_fro: d_o,
            planes_vs_emu_lse_max_abs: d_l,
            hilo: (ch.rel_fro, lh.max_abs),
            hilo_vs_emu: vs(&hl),
            tile: (ct.rel_fro, lt.max_abs),
            tile_vs_emu: vs(&tl),
            query_int8_vs_emu: vs(&q8),
            p_int8_vs_emu: vs(&p8),
            f32_planes_vs_emu: vs(&f32p),
        });
    }
    rows
}

/// The table as Markdown, one line per row.
pub fn plane_accuracy_markdown(rows: &[PlaneAccuracyRow]) -> String {
    let mut s = String::from(
        "| setting | d | keys | O rel. Frobenius err: emulation -> INT8 planes | outlier heads | clean heads | LSE max abs err | INT8 planes vs emulation: O rel. Frobenius, LSE max abs | only q INT8 | only P INT8 | f32 planes | q hi/lo INT8: O err, LSE err vs golden | q hi/lo INT8 vs emulation | q hi/lo, P tile scale: err vs golden | the same vs emulation |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.4e} -> {:.4e} ({:+.2}%) | {:.4e} -> {:.4e} | {:.4e} -> {:.4e} | {:.4e} -> {:.4e} | {:.3e}, {:.3e} | {:.3e}, {:.3e} | {:.3e}, {:.3e} | {:.1e}, {:.1e} | {:.4e}, {:.4e} | {:.3e}, {:.3e} | {:.4e}, {:.4e} | {:.3e}, {:.3e} |\n",
            r.setting,
            r.head_dim,
            r.seqlen_k,
            r.emu_rel_fro,
            r.planes_rel_fro,
            100.0 * (r.planes_rel_fro / r.emu_rel_fro - 1.0),
            r.outlier_heads.0,
            r.outlier_heads.1,
            r.clean_heads.0,
            r.clean_heads.1,
            r.lse_max_abs.0,
            r.lse_max_abs.1,
            r.planes_vs_emu_rel_fro,
            r.planes_vs_emu_lse_max_abs,
            r.query_int8_vs_emu.0,
            r.query_int8_vs_emu.1,
            r.p_int8_vs_emu.0,
            r.p_int8_vs_emu.1,
            r.f32_planes_vs_emu.0,
            r.f32_planes_vs_emu.1,
            r.hilo.0,
            r.hilo.1,
            r.hilo_vs_emu.0,
            r.hilo_vs_emu.1,
            r.tile.0,
            r.tile.1,
            r.tile_vs_emu.0,
            r.tile_vs_emu.1,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turboquant::codebook::codebook;
    use crate::turboquant::TurboQuantConfig;
    use crate::Comparison;

    /// (a) the affine form reproduces every code's centroid: exactly in `f64` (the identity on the
    /// `f32` centroids), and to `f32` rounding of the coefficients with the `f32` coefficients
    /// (which is what the kernel's fold computes; `a + b` does not round-trip exactly).
    #[test]
    fn affine_form_reproduces_every_code() {
        for d in [16, 64, 128, 256] {
            let cb = codebook(2, d);
            let af = Affine2::of(&cb).expect("2-bit Lloyd-Max codebooks are symmetric");
            let c = cb.centroids_f32();
            let (a, b) = (c[2] as f64, c[3] as f64);
            assert_eq!(c[0], -c[3], "d {d}");
            assert_eq!(c[1], -c[2], "d {d}");
            for idx in 0..4u8 {
                let (s, m) = Affine2::planes(idx);
                assert_eq!(s * 2 + m, idx);
                let exact = -b + (a + b) * s as f64 + (b - a) * m as f64;
                assert_eq!(exact, c[idx as usize] as f64, "d {d} code {idx}");
                let f = af.combine(1.0, s as f32, m as f32);
                // rounding of the coefficients and of the sum: eps times the terms' magnitudes
                let err = (f - c[idx as usize]).abs();
                let bound = f32::EPSILON * (af.base.abs() + af.sign.abs() + af.magnitude.abs());
                assert!(err <= bound, "d {d} code {idx}: {f} vs {}", c[idx as usize]);
            }
        }
        // 3-bit codebooks are not affine in their bits
        assert!(Affine2::of(&codebook(3, 128)).is_none());
        assert!(Affine2::of(&codebook(1, 128)).is_none());
    }

    /// The INT8 operand: symmetric per-row scale, round-to-nearest-even, exact integer sums.
    #[test]
    fn int8_rows_round_to_nearest_with_a_row_scale() {
        let x = [1.0f32, -0.5, 0.25, 0.0, -1.0, 0.5 / 127.0];
        let r = PlaneRow::new(&x, Operand::Int8);
        assert_eq!(r.scale, 1.0 / 127.0);
        assert_eq!(r.values, vec![127.0, -64.0, 32.0, 0.0, -127.0, 0.0]);
        assert_eq!(r.sum, -32.0);
        // hi/lo: the residual at 254 steps a step, |lo| <= 127, 64x finer than hi alone
        let h = PlaneRow::new(&x, Operand::Int8HiLo);
        assert_eq!(h.values, r.values);
        // -63.5 -> hi -64 (ties to even), lo +0.5 step; 31.75 -> 32, -0.25 step = -63.5 -> -64
        assert_eq!(h.lo, vec![0.0, 127.0, -64.0, 0.0, 0.0, 127.0]);
        assert_eq!(h.sum, -32.0 + 190.0 / LO_STEPS);
        for (i, &xv) in x.iter().enumerate() {
            assert!((h.value(i) * h.scale - xv).abs() <= 0.5 / (127.0 * LO_STEPS) + 1e-7);
        }
        let z = PlaneRow::new(&[0.0; 4], Operand::Int8);
        assert_eq!((z.scale, z.sum), (0.0, 0.0));
        for (v, &xv) in r.values.iter().zip(&x) {
            assert!((v * r.scale - xv).abs() <= 0.5 / 127.0 + 1e-7);
        }
    }

    fn problem(d: usize, sk: usize) -> (AttentionProblem, crate::AttentionInputs) {
        let mut p = AttentionProblem::uniform(2, 3, sk, 8, 2, d, d, DType::F32);
        p.causal = true;
        p.seqlens_k = vec![sk, sk - 29];
        p.seqlens_q = vec![3, 2];
        let x = crate::turbo::llm_like_inputs(&p, 7);
        (p, x)
    }

    /// (b) with `f32` operands the plane path is the lookup path up to `f32` rounding, for 2-bit
    /// keys and values with and without QJL, ragged lengths that miss the 16-token stages, GQA.
    #[test]
    fn f32_planes_equal_the_lookup_path() {
        for d in [64, 128] {
            let (p, x) = problem(d, 77);
            for (kb, vb, qjl) in [(2, 2, false), (3, 2, true), (3, 3, true), (4, 2, false)] {
                let cfg = TurboQuantConfig {
                    key_bits: kb,
                    value_bits: vb,
                    key_qjl: qjl,
                    defer_value_unrotation: true,
                    ..TurboQuantConfig::paper_default(&p)
                };
                cfg.check(&p).unwrap();
                let codec = TurboQuantCodec::new(&cfg, d, d);
                let kv = codec.compress(&p, &x);
                let emu = codec.attend(&cfg, &p, &x.q, &kv);
                let planes = attend_planes(&codec, &p, &x.q, &kv, PlaneOperands::F32);
                let co = Comparison::f32(&emu.o.data, &planes.o.data);
                let cl = Comparison::f32(&emu.lse.data, &planes.lse.data);
                let tag = format!("d {d} k{kb} v{vb} qjl {qjl}");
                assert_eq!(co.non_finite_mismatch, None, "{tag}");
                assert_eq!(cl.non_finite_mismatch, None, "{tag}");
                assert!(co.rel_fro < 2e-6, "{tag}: O {co:?}");
                assert!(cl.max_abs < 2e-5, "{tag}: LSE {cl:?}");
            }
        }
    }

    /// The INT8 contract changes the result, but stays close to the emulation (the accuracy
    /// numbers themselves are [`plane_accuracy_table`]'s, in docs/ACCURACY.md).
    #[test]
    fn int8_planes_stay_close_to_the_emulation() {
        let (p, x) = problem(128, 77);
        for (kb, vb, qjl) in [(2, 2, false), (3, 2, true)] {
            let cfg = TurboQuantConfig {
                key_bits: kb,
                value_bits: vb,
                key_qjl: qjl,
                ..TurboQuantConfig::paper_default(&p)
            };
            let codec = TurboQuantCodec::new(&cfg, 128, 128);
            let kv = codec.compress(&p, &x);
            let emu = codec.attend(&cfg, &p, &x.q, &kv);
            let planes = attend_planes(&codec, &p, &x.q, &kv, PlaneOperands::INT8);
            let co = Comparison::f32(&emu.o.data, &planes.o.data);
            assert_eq!(co.non_finite_mismatch, None);
            assert!(co.rel_fro > 0.0, "INT8 operands must change something");
            assert!(co.rel_fro < 5e-2, "k{kb} v{vb}: {co:?}");
        }
    }

    /// Prints the accuracy table (`cargo test -p ferrattn-core --release plane_accuracy -- --ignored
    /// --nocapture`); its numbers are docs/ACCURACY.md's.
    #[test]
    #[ignore = "prints the docs' table; seconds in release"]
    fn plane_accuracy() {
        let mut rows = Vec::new();
        for (d, sk) in [(128, 516), (64, 516), (128, 4112), (64, 4112)] {
            rows.extend(plane_accuracy_table(2025, d, sk));
        }
        println!("{}", plane_accuracy_markdown(&rows));
    }
}
