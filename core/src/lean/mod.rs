//! LeanAttention (Sanovar et al.): stream-K decode.
//!
//! The decode work of a batch — every (sequence, KV head, query-tile group) times its KV tiles —
//! is one flat iteration space split evenly over a persistent grid of CTAs (Lean appendix E,
//! Alg. 2), so ragged batches and few heads still keep every SM busy. Each CTA runs LeanTile
//! (Alg. 1: blocked online softmax) over its range and either stores a partial `(O, m, l)` or, as a
//! tile's host block, merges the partials of the CTAs after it with the associative rescaling of
//! appendix D. [`schedule`] holds the schedule, [`plan`] picks tile sizes and the grid from the
//! device, [`emulate`] executes the schedule on the CPU exactly as the CTAs would.
//!
//! Supported (the closed list the CUDA kernel covers): decode with 1..=8 query tokens, head dims
//! 64/128/256 (`head_dim_qk == head_dim_v`), 1..=16 query heads per KV head, separate K/V, f16 and
//! bf16 (f32 on the CPU only), ragged `seqlens_k`, bottom-right causal masks.

pub mod schedule;

use crate::{
    AttentionInputs, AttentionOutput, AttentionProblem, BackendKind, BlockSizes, CoreError, DType,
    DeviceCaps, KvLayout, Provenance, Result, SoftmaxState, Tensor,
};
pub use schedule::{KernelTables, Schedule, Segment, TileSpace};
use serde::{Deserialize, Serialize};

/// Most query rows one output tile holds (the CUDA kernel keeps them all in registers).
pub const MAX_TILE_M: usize = 16;
/// Longest query (tokens per sequence) a decode plan accepts.
pub const MAX_SEQLEN_Q: usize = 8;
/// Most query heads per KV head.
pub const MAX_GROUP: usize = 16;
/// Head dimensions with a kernel.
pub const HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Candidate keys per LeanTile iteration, largest first.
pub const TILE_K_CHOICES: [usize; 3] = [128, 64, 32];
/// Splits FlashDecoding may use at most (as FlashAttention-2 does).
pub const MAX_FIXED_SPLITS: usize = 128;

/// Plan of a stream-K (or fixed-split) decode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeanPlan {
    /// Keys per LeanTile iteration (T_n in Alg. 1, B_c).
    pub tile_k: usize,
    /// CTAs in the grid (persistent for stream-K: at most `compute_units * ctas_per_unit`).
    pub num_ctas: usize,
    /// Query rows per output tile (T_m): query heads of one KV head times query tokens, <= 16.
    pub tile_m: usize,
    /// Output tiles per (sequence, KV head): `ceil(group * seqlen_q / tile_m)`.
    pub query_groups: usize,
    /// Which CTA computes which iterations.
    pub schedule: Schedule,
}

impl BlockSizes for LeanPlan {
    fn block_q(&self) -> usize {
        self.tile_m
    }
    fn block_k(&self) -> usize {
        self.tile_k
    }
}

impl LeanPlan {
    /// The iteration space this plan schedules for `p`.
    pub fn tile_space(&self, p: &AttentionProblem) -> TileSpace {
        TileSpace::new(p, self.tile_k, self.query_groups)
    }

    /// Checks a plan from outside against `p` and the device: the problem is supported,
    /// `tile_k` is one of [`TILE_K_CHOICES`] whose K/V tiles fit the device's shared memory,
    /// `tile_m` and `query_groups` are what the problem's rows give, and the schedule covers
    /// every iteration of every tile exactly once, in order ([`Schedule::check`]). On CUDA the
    /// stream-K grid must also be co-resident (its host blocks wait for later CTAs) and
    /// iteration indices must fit 32 bits.
    pub fn check(&self, p: &AttentionProblem, caps: &DeviceCaps) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidPlan(format!("lean: {m}")));
        check_supported(p, caps)?;
        let share = caps.shared_mem_per_block / caps.ctas_per_unit.max(1);
        let need =
            (2 * (p.head_dim_qk + p.head_dim_v) * p.dtype.size_bytes()).saturating_mul(self.tile_k);
        if !TILE_K_CHOICES.contains(&self.tile_k) || need > share {
            return bad(format!(
                "tile_k = {} ({need} bytes of K/V tiles); it must be one of {TILE_K_CHOICES:?} \
                 and fit the {share} bytes of shared memory per CTA of {}",
                self.tile_k, caps.name
            ));
        }
        let (tile_m, query_groups) = tile_rows(p);
        if (self.tile_m, self.query_groups) != (tile_m, query_groups) {
            return bad(format!(
                "tile_m = {}, query_groups = {}; this problem's {} query rows per KV head give \
                 tile_m = {tile_m}, query_groups = {query_groups}",
                self.tile_m,
                self.query_groups,
                p.group_size() * p.max_seqlen_q
            ));
        }
        let space = self.tile_space(p);
        self.schedule.check(&space)?;
        if self.num_ctas != self.schedule.num_ctas() {
            return bad(format!(
                "num_ctas = {} but the schedule has {} CTAs",
                self.num_ctas,
                self.schedule.num_ctas()
            ));
        }
        if caps.backend == BackendKind::Cuda {
            if space.total_iters() >= 1 << 31 {
                return bad(format!(
                    "{} iterations; the device indexes them in 32 bits",
                    space.total_iters()
                ));
            }
            let slots = caps.slots();
            if self.schedule.merges_in_kernel() && self.num_ctas > slots {
                return bad(format!(
                    "{} stream-K CTAs but {} holds {slots} at once; a host block waits for later CTAs, \
                     so the whole grid must be resident",
                    self.num_ctas, caps.name
                ));
            }
        }
        Ok(())
    }
}

/// Checks that `p` is in the supported list; `caps` decides whether f32 is allowed.
pub fn check_supported(p: &AttentionProblem, caps: &DeviceCaps) -> Result<()> {
    let unsupported = |what: String, supported: &str| {
        Err(CoreError::Unsupported {
            what,
            supported: supported.into(),
        })
    };
    if p.kv_layout != KvLayout::Separate {
        return unsupported(
            "lean decode over an MLA latent cache".into(),
            "separate K and V",
        );
    }
    if p.head_dim_qk != p.head_dim_v || !HEAD_DIMS.contains(&p.head_dim_qk) {
        return unsupported(
            format!("lean head dims qk={} v={}", p.head_dim_qk, p.head_dim_v),
            "qk = v in {64, 128, 256}",
        );
    }
    if p.max_seqlen_q > MAX_SEQLEN_Q {
        return unsupported(
            format!(
                "lean decode with {} query tokens per sequence",
                p.max_seqlen_q
            ),
            "1..=8 (decode; use exact attention for prefill)",
        );
    }
    if p.group_size() > MAX_GROUP {
        return unsupported(
            format!("lean with {} query heads per KV head", p.group_size()),
            "1..=16",
        );
    }
    match (p.dtype, caps.backend) {
        (DType::F16 | DType::BF16, _) | (DType::F32, BackendKind::Cpu) => Ok(()),
        (DType::F32, b) => unsupported(format!("lean in f32 on {b}"), "f16, bf16 (f32 on cpu)"),
    }
}

/// Keys per iteration: the largest of 128/64/32 whose double-buffered K and V tiles fit in one
/// CTA's share of shared memory (`shared_mem_per_block / ctas_per_unit`), as Alg. 1 keeps
/// `K_f` and `V_f` in SMEM.
pub fn choose_tile_k(p: &AttentionProblem, caps: &DeviceCaps) -> Result<usize> {
    let share = caps.shared_mem_per_block / caps.ctas_per_unit.max(1);
    let elem = p.dtype.size_bytes();
    TILE_K_CHOICES
        .into_iter()
        .find(|&t| 2 * t * (p.head_dim_qk + p.head_dim_v) * elem <= share)
        .ok_or_else(|| {
            CoreError::InvalidPlan(format!(
                "{} has {share} bytes of shared memory per CTA; two 32-key K/V tiles of head dim {} need {}",
                caps.name,
                p.head_dim_qk,
                2 * 32 * (p.head_dim_qk + p.head_dim_v) * elem
            ))
        })
}

fn tile_rows(p: &AttentionProblem) -> (usize, usize) {
    let rows = p.group_size() * p.max_seqlen_q;
    let tile_m = rows.min(MAX_TILE_M);
    (tile_m, rows.div_ceil(tile_m))
}

/// Iterations per CTA slot up to which [`plan`] may shrink the grid to align CTAs with tiles.
pub const ALIGN_MAX_ITERS_PER_SLOT: u64 = 32;
/// Iterations in all up to which [`plan`] runs one CTA per SM when there are fewer tiles than SMs
/// (measured on an H100 and an H200: Lean-paper B=1 ctx 1k, 448 iterations, and Llama B=1 ctx 8k,
/// 1024, are as fast or faster there on both; Lean-paper B=1 ctx 4k, 1792, is 13% slower on the
/// H200).
pub const ONE_PER_SM_MAX_ITERS: u64 = 1024;

/// Plans a decode: a persistent stream-K grid of `compute_units * ctas_per_unit` CTAs (Alg. 2
/// `G`), refined by three rules measured on an H100 (`benches/lean_grid.rs`, results in
/// `docs/results/lean-h100-2026-11-23-run1/grid.json`), all for batches whose sequences are
/// equally long:
///
/// - **Aligned, one CTA per SM, where DRAM per SM is low.** On a device that reports at most
///   [`ONE_PER_SM_MAX_DRAM_PER_UNIT`] of DRAM bandwidth per SM (an H100 SXM and an H200), with
///   fewer tiles than slots and any amount of work: the aligned grid of at most one CTA per SM
///   (`aligned_one_per_sm`), when it keeps 80% of the SMs busy and, taking several tiles per
///   CTA, gives each at least [`FEWER_CTAS_MIN_ITERS`] iterations. Otherwise the rules below.
/// - **Aligned, one CTA per SM.** With fewer tiles than multiprocessors and very little work (at
///   most [`ONE_PER_SM_MAX_ITERS`] iterations in all), the grid is `tiles * floor(SMs / tiles)`:
///   every CTA stays inside one tile (no tile switch, at most one merge), the CTAs of a tile's
///   neighbours read the same key positions of other heads at the same time (whole K/V rows of
///   the NHD layout per DRAM page), and no SM runs two CTAs while another runs one. Beyond that
///   the H100 and the H200 disagree (`docs/results/lean-h200-2026-11-23-grid/`): at the
///   Lean-paper shape B=1 ctx 16k 112 CTAs took 81.3 us against 89.0 us for 224 on the H100, but
///   72.2 us against 63.9 us on the H200, whose higher bandwidth needs more loads in flight; a
///   paged cache at 128 CTAs ran 23-34% slower than contiguous on the H200 (Llama B=8 ctx 8k,
///   B=1 ctx 32k). Heavier grids take the next rule, which the H200 prefers.
/// - **Aligned, every slot.** With at least as many tiles as SMs but fewer than slots and little
///   work, `tiles * floor(slots / tiles)` CTAs, the same alignment (the earlier rule).
/// - **One CTA per tile.** With at least as many tiles as slots, when tiles are short
///   ([`SHORT_TILE_ITERS`] iterations or fewer) or fill whole waves (wave efficiency
///   `(tiles / slots) / ceil(tiles / slots)` at least [`FULL_WAVES`]), a fixed split of one chunk
///   per tile: no partial, no merge, no second launch, CTAs in tile order (neighbouring heads of
///   one sequence run together). Lean-paper B=64 ctx 1k: 313 us against 336 us for stream-K.
///   Not persistent, so not launched cooperatively; its workspace has no per-CTA region.
pub fn plan(p: &AttentionProblem, caps: &DeviceCaps) -> Result<LeanPlan> {
    plan_rules(p, caps, true)
}

/// [`plan`]'s rules; `several_tiles_per_sm` false leaves out the one-CTA-per-SM grids that give a
/// CTA several whole tiles (more tiles than SMs), which [`plan_paged`] does not take.
fn plan_rules(
    p: &AttentionProblem,
    caps: &DeviceCaps,
    several_tiles_per_sm: bool,
) -> Result<LeanPlan> {
    let sms = caps.compute_units.max(1);
    let slots = sms.saturating_mul(caps.ctas_per_unit.max(1));
    let mut pl = plan_with_ctas(p, caps, slots)?;
    let space = pl.tile_space(p);
    let tiles = space.num_tiles();
    let uniform = space.iters.windows(2).all(|w| w[0] == w[1]);
    let light = space.total_iters() <= ALIGN_MAX_ITERS_PER_SLOT.saturating_mul(slots as u64);
    if !uniform {
        return Ok(pl);
    }
    let n = space.iters[0];
    let low_bandwidth = caps
        .dram_bytes_per_unit()
        .is_some_and(|b| b <= ONE_PER_SM_MAX_DRAM_PER_UNIT);
    if tiles < slots && low_bandwidth && (several_tiles_per_sm || tiles <= sms) {
        if let Some(g) = aligned_one_per_sm(tiles, sms, space.total_iters()) {
            pl.schedule = Schedule::stream_k(&space, g);
            pl.num_ctas = pl.schedule.num_ctas();
            return Ok(pl);
        }
    }
    if tiles < slots && light {
        let one_per_sm = tiles <= sms && space.total_iters() <= ONE_PER_SM_MAX_ITERS;
        let per = if one_per_sm { sms } else { slots } / tiles;
        let aligned = tiles * per;
        if aligned < pl.num_ctas {
            pl.schedule = Schedule::stream_k(&space, aligned);
            pl.num_ctas = pl.schedule.num_ctas();
        }
    } else if tiles >= slots {
        let waves = tiles as f64 / slots as f64;
        if n <= SHORT_TILE_ITERS || waves / waves.ceil() >= FULL_WAVES {
            pl.schedule = Schedule::fixed_split(&space, 1);
            pl.num_ctas = pl.schedule.num_ctas();
        }
    }
    Ok(pl)
}

/// [`plan`] for a paged KV cache: the same grids as a contiguous one, except the one-CTA-per-SM
/// grids that give each CTA several whole tiles (more tiles than SMs), where the slot-filling
/// grid stays. Until 2026-11-26 it left out the one-CTA-per-SM rule
/// ([`ONE_PER_SM_MAX_DRAM_PER_UNIT`]) altogether: the paged kernel then moved each loaded page
/// word between registers an iteration after its load, which stalled every stage at one CTA per
/// SM (Lean-paper B=1 ctx 64k on 112 CTAs 1.34-1.46x contiguous with pages of 16). With the words
/// copied into shared memory (`lean_decode.cu`, `words_s`) the aligned grids are the faster ones
/// for paged caches where a CTA holds part of one tile (`lean_paged --same-plan` against the
/// slot-filling grids in the same call, `docs/results/h200-2026-11-26-lean-paged11/`): on an H100
/// Lean-paper B=1 ctx 64k 1.022-1.025x contiguous with pages of 16 against 1.079-1.080x, Llama
/// B=1 ctx 32k 1.025-1.034x against 1.065-1.069x; on an H200 Lean-paper B=1 ctx 64k 1.038-1.041x
/// against 1.065-1.066x, Llama B=1 ctx 32k 1.038-1.042x against 1.075-1.079x. With two whole
/// tiles per CTA (Lean-paper B=4 ctx 16k: 224 tiles on 112 CTAs) the same H200 call measured the
/// paged kernel at 243-246 us on the aligned grid against 234-235 us on the slot-filling one
/// (`docs/results/h200-2026-11-26-v12-lean/call1/`). With the four-stage paged instance that the
/// CUDA backend runs on one-CTA-per-SM grids at head dim 64 where DRAM bandwidth per SM is high
/// (`docs/results/lean-paged16-h200-2026-11-26/`, docs/DEVICE_PATH.md "Lean paged, sixteenth
/// session"), the aligned grid at that row measured, against the slot-filling grid in the same
/// calls, over the four page layouts: on H200s 0.997-1.065x contiguous against 1.043-1.067x in
/// three calls (two machines) but 1.08-1.11x against 1.065-1.069x in one; on an H100
/// 1.053-1.066x against 1.041-1.049x. With the chips disagreeing the rule stays as it is.
pub fn plan_paged(p: &AttentionProblem, caps: &DeviceCaps) -> Result<LeanPlan> {
    plan_rules(p, caps, false)
}

/// DRAM bandwidth per SM (bytes per second) up to which [`plan`] runs aligned grids of one CTA per
/// SM on uniform batches with fewer tiles than slots, whatever the work. Measured with
/// `benches/lean_grid.rs` on the two chips the device tool lends (132 SMs each):
/// - an H100 SXM (3.35 TB/s peak, 25 GB/s per SM) read the Lean-paper rows B=1 ctx 16k / 64k and
///   B=4 ctx 16k / 64k in 81.0 / 309.8 / 317.9 / 1264 us on 112 CTAs against 88.4 / 330.9 /
///   333.5 / 1298 us on the slot-filling grids (2026-11-25, `docs/results/h100-2026-11-25-grid-rule/`);
/// - an H200 (4.8 TB/s, 36 GB/s per SM) was 12-17% slower on 112 CTAs with the kernels of
///   2026-11-23 (`docs/results/lean-h200-2026-11-23-grid/`), when a stage's copies cost about 330
///   instructions a thread; with the copies cut to about 70 (2026-11-26) the aligned grids are
///   1-5% faster on every row this rule picks: B=1 ctx 16k 58.2-58.4 us on 112 CTAs against
///   61.5-61.6 on 224, B=4 ctx 16k 215.3 against 227.6, Llama B=1 ctx 32k 38.5-38.7 on 128 against
///   40.3, Llama B=8 ctx 32k 242.1 against 250.8 (`docs/results/h200-2026-11-26-lean-copy/`).
///
/// The threshold sits above both chips; faster memory per SM (B200-class) is unmeasured and keeps
/// the slot-filling grids.
pub const ONE_PER_SM_MAX_DRAM_PER_UNIT: u64 = 40_000_000_000;
/// Fraction of the SMs an aligned one-per-SM grid must keep busy to be chosen.
pub const ONE_PER_SM_MIN_FILL: f64 = 0.8;
/// Iterations per CTA below which a grid of fewer CTAs than tiles is not chosen (H100: Lean-paper
/// B=4 ctx 1k, 16 per CTA on 112 CTAs, took 25.7 us against 23.9 us on one CTA per tile; Llama
/// B=32 ctx 1k, 32 per CTA on 128 CTAs, 52.4 against 49.6 us; Lean-paper B=4 ctx 4k, 64 per
/// CTA, 83.4 against 85.3 us).
pub const FEWER_CTAS_MIN_ITERS: u64 = 64;

/// The aligned grid of at most one CTA per SM: `tiles * floor(sms / tiles)` CTAs when the tiles
/// fit the SMs (each CTA inside one tile), else `tiles / k` for the smallest `k` dividing the
/// tiles that fits (each CTA `k` whole tiles: no partial, no merge). `None` when it would leave
/// more than a fifth of the SMs idle or give a CTA fewer than [`FEWER_CTAS_MIN_ITERS`]
/// iterations while taking several tiles.
fn aligned_one_per_sm(tiles: usize, sms: usize, total_iters: u64) -> Option<usize> {
    let g = if tiles <= sms {
        tiles * (sms / tiles)
    } else {
        let k = (2..=tiles).find(|&k| tiles.is_multiple_of(k) && tiles / k <= sms)?;
        let g = tiles / k;
        if total_iters / (g as u64) < FEWER_CTAS_MIN_ITERS {
            return None;
        }
        g
    };
    (g as f64 >= ONE_PER_SM_MIN_FILL * sms as f64).then_some(g)
}

/// Tiles of at most this many iterations are "short" for [`plan`]: stream-K's per-tile costs
/// (a CTA straddling tiles loads Q, reduces and stores or merges once more) outweigh its balance.
pub const SHORT_TILE_ITERS: u64 = 16;
/// Wave efficiency from which [`plan`] runs one CTA per tile when tiles fill the grid (measured:
/// 0.97 with B=64 x 8 KV heads on 264 slots won by 1-2%, 0.85 with 896 tiles lost by 1-2%).
pub const FULL_WAVES: f64 = 0.95;

/// A stream-K plan over exactly `min(ctas, I)` CTAs (no minimum work per CTA).
pub fn plan_with_ctas(p: &AttentionProblem, caps: &DeviceCaps, ctas: usize) -> Result<LeanPlan> {
    p.validate()?;
    check_supported(p, caps)?;
    let tile_k = choose_tile_k(p, caps)?;
    let (tile_m, query_groups) = tile_rows(p);
    let space = TileSpace::new(p, tile_k, query_groups);
    if caps.backend == BackendKind::Cuda && space.total_iters() >= 1 << 31 {
        return Err(CoreError::Unsupported {
            what: format!("{} LeanTile iterations", space.total_iters()),
            supported: "fewer than 2^31 (32-bit iteration indices on the device)".into(),
        });
    }
    let schedule = Schedule::stream_k(&space, ctas);
    Ok(LeanPlan {
        tile_k,
        num_ctas: schedule.num_ctas(),
        tile_m,
        query_groups,
        schedule,
    })
}

/// Plans the FlashDecoding baseline over the same tiles: `splits` chunks per tile for the
/// longest sequence, or FlashAttention-2's heuristic when `None`.
pub fn plan_fixed_split(
    p: &AttentionProblem,
    caps: &DeviceCaps,
    splits: Option<usize>,
) -> Result<LeanPlan> {
    let mut plan = plan(p, caps)?;
    let space = plan.tile_space(p);
    let max_iters = space.iters.iter().copied().max().unwrap_or(1);
    let splits = match splits {
        Some(0) => {
            return Err(CoreError::BadLength {
                what: "splits".into(),
                value: 0,
                requirement: "at least 1".into(),
            })
        }
        Some(s) => s,
        None => schedule::fixed_split_count(
            space.num_tiles(),
            caps.slots(),
            max_iters,
            MAX_FIXED_SPLITS,
        ),
    };
    plan.schedule = Schedule::fixed_split(&space, splits);
    plan.num_ctas = plan.schedule.num_ctas();
    Ok(plan)
}

/// LeanTile (Alg. 1) for rows `rows` of one tile over local iterations `[begin, end)`: blocked
/// online softmax in f32, one block of `tile_k` keys at a time (lines 13-26).
fn lean_tile(
    plan: &LeanPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
    (b, hk, qg): (usize, usize, usize),
    begin: u64,
    end: u64,
) -> Vec<SoftmaxState> {
    let group = p.group_size();
    let (dk, dv) = (p.head_dim_qk, p.head_dim_v);
    let len = p.seqlens_k[b];
    let mut states = vec![SoftmaxState::empty(dv); plan.tile_m];
    let mut s = vec![0f32; plan.tile_k];
    for (r, st) in states.iter_mut().enumerate() {
        let row = qg * plan.tile_m + r;
        let (i, hq) = (row / group, hk * group + row % group);
        if i >= p.seqlens_q[b] {
            continue; // padding row of the tile or of the sequence
        }
        let visible = p.visible_keys(b, i);
        // scale before the dot product: the logit range is what must fit f32 (crate::range)
        let q: Vec<f32> =
            x.q.row4(b, i, hq)
                .iter()
                .map(|&v| v * p.softmax_scale)
                .collect();
        for it in begin..end {
            let k0 = it as usize * plan.tile_k;
            let k1 = (k0 + plan.tile_k).min(len);
            let n = k1.saturating_sub(k0);
            let mut m_blk = f32::NEG_INFINITY;
            for (jj, sj) in s[..n].iter_mut().enumerate() {
                let j = k0 + jj;
                *sj = if j < visible {
                    let k = &x.k.row4(b, j, hk)[..dk];
                    q.iter().zip(k).map(|(a, c)| a * c).sum::<f32>()
                } else {
                    f32::NEG_INFINITY
                };
                m_blk = m_blk.max(*sj);
            }
            let m_new = st.m.max(m_blk);
            if m_new == f32::NEG_INFINITY {
                continue; // nothing visible yet
            }
            st.rescale_to(m_new);
            for (jj, &sj) in s[..n].iter().enumerate() {
                if sj == f32::NEG_INFINITY {
                    continue;
                }
                let pj = (sj - m_new).exp();
                st.l += pj;
                for (a, &v) in st.acc.iter_mut().zip(x.v_row(p, b, k0 + jj, hk)) {
                    *a += pj * v;
                }
            }
        }
    }
    states
}

/// CPU emulation of the stream-K decode: every CTA's segments produce partial states in CTA
/// order, then each host block merges the later CTAs' partials into its own in CTA order
/// (Alg. 2 lines 26-36) and writes `O = acc / l`, `LSE = m + ln l` (lines 38-39).
pub fn emulate(
    plan: &LeanPlan,
    p: &AttentionProblem,
    x: &AttentionInputs,
) -> Result<AttentionOutput> {
    // this is a public entry: the plan may come from outside, and its schedule drives every
    // index below, so it is checked in full (on the CPU, whose caps accept any grid)
    p.validate()?;
    plan.check(p, &DeviceCaps::cpu(1))?;
    check_inputs(p, x)?;
    crate::range::check_f32_softmax(p, x)?;
    let space = plan.tile_space(p);
    let (sq, hq, dv) = (p.max_seqlen_q, p.heads_q, p.head_dim_v);
    let group = p.group_size();
    let mut o = Tensor::zeros(&[p.batch, sq, hq, dv], p.dtype);
    let mut lse = Tensor {
        shape: vec![p.batch, hq, sq],
        dtype: DType::F32,
        data: vec![f32::NEG_INFINITY; p.batch * hq * sq],
    };
    // Partials by tile, in CTA order; the first is the host's own segment.
    let segments = plan.schedule.segments(&space);
    let mut per_tile: Vec<Vec<Vec<SoftmaxState>>> = vec![Vec::new(); space.num_tiles()];
    for seg in &segments {
        let coords = space.tile_coords(seg.tile);
        per_tile[seg.tile].push(lean_tile(
            plan,
            p,
            x,
            coords,
            seg.local_begin,
            seg.local_end,
        ));
    }
    for (tile, parts) in per_tile.into_iter().enumerate() {
        let (b, hk, qg) = space.tile_coords(tile);
        let mut parts = parts.into_iter();
        let mut host = parts.next().expect("every tile has a host segment");
        for part in parts {
            for (h, q) in host.iter_mut().zip(&part) {
                h.merge(q);
            }
        }
        for (r, st) in host.iter().enumerate() {
            let row = qg * plan.tile_m + r;
            let (i, h) = (row / group, hk * group + row % group);
            if i >= p.seqlens_q[b] {
                continue;
            }
            let (orow, l) = st.finish();
            for (d, v) in o.row4_mut(b, i, h).iter_mut().zip(orow) {
                *d = p.dtype.round(v);
            }
            lse.data[(b * hq + h) * sq + i] = l;
        }
    }
    Ok(AttentionOutput {
        o,
        lse,
        provenance: Provenance::cpu(),
    })
}

/// Checks that `x` holds the separate Q, K, V tensors `p` describes.
fn check_inputs(p: &AttentionProblem, x: &AttentionInputs) -> Result<()> {
    let v = x.v.as_ref().ok_or_else(|| CoreError::Unsupported {
        what: "lean decode without a separate v tensor".into(),
        supported: "separate K and V".into(),
    })?;
    for (name, t, want) in [
        (
            "q",
            &x.q,
            [p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk],
        ),
        (
            "k",
            &x.k,
            [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_qk],
        ),
        ("v", v, [p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_v]),
    ] {
        if t.shape != want || t.data.len() != want.iter().product::<usize>() {
            return Err(CoreError::Shape {
                tensor: name,
                actual: t.shape.clone(),
                expected: format!("{want:?} with as many values, as the problem says"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{golden, Comparison, Tolerance};
    use proptest::prelude::*;
    use rand::{rngs::StdRng, SeedableRng};

    fn inputs(p: &AttentionProblem, seed: u64) -> AttentionInputs {
        let mut rng = StdRng::seed_from_u64(seed);
        let q = Tensor::randn(
            &[p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk],
            p.dtype,
            1.0,
            &mut rng,
        );
        let k = Tensor::randn(
            &[p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_qk],
            p.dtype,
            1.0,
            &mut rng,
        );
        let v = Tensor::randn(
            &[p.batch, p.max_seqlen_k, p.heads_kv, p.head_dim_v],
            p.dtype,
            1.0,
            &mut rng,
        );
        AttentionInputs {
            seqlens_k: Some(p.seqlens_k.iter().map(|&x| x as i64).collect()),
            seqlens_q: Some(p.seqlens_q.iter().map(|&x| x as i64).collect()),
            ..AttentionInputs::new(q, k, v)
        }
    }

    fn check(
        plan: &LeanPlan,
        p: &AttentionProblem,
        x: &AttentionInputs,
    ) -> std::result::Result<(), String> {
        let gold = golden::exact_attention(p, x);
        let got = emulate(plan, p, x).map_err(|e| e.to_string())?;
        // f32 arithmetic in another order than the f64 reference
        Comparison::f32(&gold.o.data, &got.o.data).check("O", &Tolerance::f32_reorder())?;
        Comparison::f32(&gold.lse.data, &got.lse.data).check("LSE", &Tolerance::f32_reorder())
    }

    fn cpu_caps(ctas: usize) -> DeviceCaps {
        DeviceCaps {
            compute_units: ctas,
            ..DeviceCaps::cpu(ctas)
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
        /// Equal to the golden reference for every CTA count 1..=N, ragged batches, GQA,
        /// multi-token causal decode.
        #[test]
        fn emulation_matches_golden_for_every_cta_count(
            lens in prop::collection::vec(0usize..300, 1..4),
            group in prop::sample::select(vec![1usize, 3, 8]),
            sq in 1usize..4,
            causal in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let max_k = lens.iter().copied().max().unwrap().max(1);
            let mut p = AttentionProblem::uniform(lens.len(), sq, max_k, 2 * group, 2, 64, 64, DType::F32);
            p.seqlens_k = lens.clone();
            p.seqlens_q[0] = sq.saturating_sub(1).max(1); // a ragged query length too
            p.causal = causal;
            p.softmax_scale = 0.3;
            let x = inputs(&p, seed);
            let base = plan(&p, &cpu_caps(1)).unwrap();
            let total = base.tile_space(&p).total_iters() as usize;
            for ctas in 1..=total + 1 {
                let pl = plan_with_ctas(&p, &cpu_caps(1), ctas).unwrap();
                prop_assert_eq!(pl.num_ctas, ctas.min(total));
                check(&pl, &p, &x).map_err(|e| TestCaseError::fail(format!("{ctas} CTAs: {e}")))?;
            }
            for splits in [1, 2, 5] {
                let pl = plan_fixed_split(&p, &cpu_caps(4), Some(splits)).unwrap();
                check(&pl, &p, &x).map_err(|e| TestCaseError::fail(format!("{splits} splits: {e}")))?;
            }
        }
    }

    #[test]
    fn planner_aligns_small_grids_and_runs_one_cta_per_tile_when_tiles_fill_the_grid() {
        let caps = DeviceCaps::hopper_reference();
        let sms = caps.compute_units;
        let slots = sms * caps.ctas_per_unit;
        let uniform = |batch: usize, ctx: usize, hq: usize, hk: usize, d: usize| {
            AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, DType::F16)
        };
        // 56 tiles, very light: a multiple of the tiles that fits one CTA per SM
        let p = uniform(1, 1024, 56, 56, 64);
        let pl = plan(&p, &caps).unwrap();
        assert!(matches!(pl.schedule, Schedule::StreamK { .. }));
        assert_eq!(pl.num_ctas, 56 * (sms / 56));
        // 56 tiles, light but more than ONE_PER_SM_MAX_ITERS: a multiple that fills the slots
        for ctx in [4096, 16384] {
            let pl = plan(&uniform(1, ctx, 56, 56, 64), &caps).unwrap();
            assert_eq!(pl.num_ctas, 56 * (slots / 56), "ctx {ctx}");
        }
        // Llama B=8 ctx 8k (64 tiles, 8192 iterations): every slot the tiles divide
        assert_eq!(
            plan(&uniform(8, 8192, 32, 8, 128), &caps).unwrap().num_ctas,
            256
        );
        // 224 tiles (more than SMs, fewer than slots), light: one CTA per tile, stream-K tables
        let pl = plan(&uniform(4, 1024, 56, 56, 64), &caps).unwrap();
        assert_eq!(pl.num_ctas, 224);
        // heavy: every slot
        let pl = plan(&uniform(1, 262144, 56, 56, 64), &caps).unwrap();
        assert_eq!(pl.num_ctas, slots);
        // short tiles filling the grid: one CTA per tile, no merge
        for (b, ctx, hq, hk, d) in [(64, 1024, 32, 8, 128), (16, 1024, 56, 56, 64)] {
            let p = uniform(b, ctx, hq, hk, d);
            let pl = plan(&p, &caps).unwrap();
            let space = pl.tile_space(&p);
            assert!(pl.schedule.one_cta_per_tile(&space), "{pl:?}");
            assert!(!pl.schedule.merges_in_kernel());
            pl.check(&p, &caps).unwrap();
        }
        // long tiles in 3.4 waves (efficiency 0.85): stream-K
        let p = uniform(16, 16384, 56, 56, 64);
        assert!(matches!(
            plan(&p, &caps).unwrap().schedule,
            Schedule::StreamK { .. }
        ));
        // long tiles in whole waves: one CTA per tile
        let p = uniform(64, 16384, 56, 56, 64);
        let pl = plan(&p, &caps).unwrap();
        assert!(pl.schedule.one_cta_per_tile(&pl.tile_space(&p)));
        // ragged batches keep stream-K
        let mut p = uniform(64, 1024, 32, 8, 128);
        p.seqlens_k[3] = 100;
        assert!(matches!(
            plan(&p, &caps).unwrap().schedule,
            Schedule::StreamK { .. }
        ));
    }

    #[test]
    fn planner_runs_aligned_one_per_sm_grids_where_dram_per_sm_is_low() {
        let uniform = |batch: usize, ctx: usize, hq: usize, hk: usize, d: usize| {
            AttentionProblem::uniform(batch, 1, ctx, hq, hk, d, d, DType::F16)
        };
        let with_bw = |tb_s: u64| DeviceCaps {
            dram_bytes_per_s: Some(tb_s * 1_000_000_000),
            ..DeviceCaps::hopper_reference()
        };
        let h100 = with_bw(3_350); // 25 GB/s per SM
        let h200 = with_bw(4_800); // 36 GB/s per SM
        let faster = with_bw(8_000); // 61 GB/s per SM: above the threshold
        let unknown = DeviceCaps::hopper_reference();
        // (problem, CTAs on the low-bandwidth chip)
        let rows = [
            (uniform(1, 16384, 56, 56, 64), 112), // 56 tiles: two CTAs per tile
            (uniform(1, 65536, 56, 56, 64), 112), // heavy: the same
            (uniform(4, 4096, 56, 56, 64), 112),  // 224 tiles: two whole tiles per CTA
            (uniform(4, 65536, 56, 56, 64), 112), // heavy: the same
            (uniform(1, 32768, 32, 8, 128), 128), // Llama: 8 tiles x 16
            (uniform(8, 8192, 32, 8, 128), 128),  // 64 tiles x 2
        ];
        for (p, ctas) in &rows {
            let pl = plan(p, &h100).unwrap();
            assert_eq!(pl.num_ctas, *ctas, "{p:?}");
            pl.check(p, &h100).unwrap();
            let space = pl.tile_space(p);
            // aligned: every CTA's range starts and ends on a tile boundary or inside one tile
            let per = space.total_iters() / *ctas as u64;
            assert!(space.total_iters().is_multiple_of(*ctas as u64));
            assert!(per.is_multiple_of(space.iters[0]) || space.iters[0].is_multiple_of(per));
            // the H200 takes the same grids; a faster chip and an unknown one plan as before
            assert_eq!(plan(p, &h200).unwrap(), pl);
            assert_eq!(plan(p, &faster).unwrap(), plan(p, &unknown).unwrap());
        }
        // too little work per CTA for fewer CTAs than tiles (224 tiles of 8 iterations; Llama
        // B=32 ctx 1k, 256 tiles of 16): as before
        for p in [uniform(4, 1024, 56, 56, 64), uniform(32, 1024, 32, 8, 128)] {
            assert_eq!(plan(&p, &h100).unwrap(), plan(&p, &unknown).unwrap());
        }
        // tiles filling the slots: one CTA per tile, as before
        let p = uniform(16, 1024, 56, 56, 64);
        assert_eq!(plan(&p, &h100).unwrap(), plan(&p, &unknown).unwrap());
        // an aligned grid that would idle more than a fifth of the SMs (70 tiles: 70 CTAs): as before
        let p = uniform(1, 65536, 70, 70, 64);
        assert_eq!(plan(&p, &h100).unwrap(), plan(&p, &unknown).unwrap());
        // a paged cache takes the same grids (one CTA per SM here: 56 tiles, two CTAs each)
        let p = uniform(1, 65536, 56, 56, 64);
        assert_eq!(plan_paged(&p, &h100).unwrap(), plan(&p, &h100).unwrap());
        assert_ne!(plan_paged(&p, &h100).unwrap(), plan(&p, &unknown).unwrap());
        // but not where one CTA per SM gives each CTA two whole tiles (224 tiles on 112 CTAs):
        // there it keeps the slot-filling grid
        let p = uniform(4, 16384, 56, 56, 64);
        assert_eq!(plan(&p, &h100).unwrap().num_ctas, 112);
        assert_eq!(plan_paged(&p, &h100).unwrap(), plan(&p, &unknown).unwrap());
        // old serialised caps without the field still load (None)
        let mut v = serde_json::to_value(&unknown).unwrap();
        v.as_object_mut().unwrap().remove("dram_bytes_per_s");
        let back: DeviceCaps = serde_json::from_value(v).unwrap();
        assert_eq!(back.dram_bytes_per_s, None);
    }

    #[test]
    fn half_precision_within_output_tolerance_and_tiles_group_queries() {
        // 16 query heads per KV head x 2 tokens = 32 rows: two query-tile groups of 16
        let mut p = AttentionProblem::uniform(3, 2, 577, 32, 2, 128, 128, DType::BF16);
        p.seqlens_k = vec![577, 37, 1];
        let x = inputs(&p, 7);
        let pl = plan(&p, &DeviceCaps::hopper_reference()).unwrap();
        assert_eq!((pl.tile_m, pl.query_groups, pl.tile_k), (16, 2, 64));
        let gold = golden::exact_attention(&p, &x);
        let got = emulate(&pl, &p, &x).unwrap();
        Comparison::f32(&gold.o.data, &got.o.data)
            .check("O", &Tolerance::output(DType::BF16))
            .unwrap();
        Comparison::f32(&gold.lse.data, &got.lse.data)
            .check("LSE", &Tolerance::lse())
            .unwrap();
    }

    #[test]
    fn empty_sequences_give_zero_and_neg_inf() {
        let mut p = AttentionProblem::uniform(2, 1, 50, 4, 4, 64, 64, DType::F16);
        p.seqlens_k = vec![0, 50];
        let x = inputs(&p, 1);
        let out = emulate(&plan(&p, &DeviceCaps::hopper_reference()).unwrap(), &p, &x).unwrap();
        assert!(out.o.data[..4 * 64].iter().all(|&v| v == 0.0));
        assert!(out.lse.data[..4].iter().all(|&v| v == f32::NEG_INFINITY));
        assert!(out.lse.data[4..].iter().all(|v| v.is_finite()));
    }

    #[test]
    fn tile_k_follows_shared_memory() {
        let hop = DeviceCaps::hopper_reference();
        let tk = |d: usize, caps: &DeviceCaps| {
            choose_tile_k(
                &AttentionProblem::uniform(1, 1, 8, 8, 8, d, d, DType::F16),
                caps,
            )
            .unwrap()
        };
        // 227 KiB / 2 CTAs = 113.5 KiB per CTA; two K+V tiles of t keys take 4 * t * d bytes
        assert_eq!((tk(64, &hop), tk(128, &hop), tk(256, &hop)), (128, 64, 32));
        let small = DeviceCaps {
            shared_mem_per_block: 72 * 1024,
            ctas_per_unit: 1,
            ..hop.clone()
        };
        assert_eq!(tk(256, &small), 32);
        let tiny = DeviceCaps {
            shared_mem_per_block: 16 * 1024,
            ctas_per_unit: 1,
            ..hop
        };
        let e = choose_tile_k(
            &AttentionProblem::uniform(1, 1, 8, 8, 8, 256, 256, DType::F16),
            &tiny,
        );
        assert!(matches!(e, Err(CoreError::InvalidPlan(_))));
    }

    #[test]
    fn unsupported_configurations_say_what_is_supported() {
        let hop = DeviceCaps::hopper_reference();
        let cases = [
            AttentionProblem::uniform(1, 9, 64, 8, 8, 128, 128, DType::F16), // prefill
            AttentionProblem::uniform(1, 1, 64, 8, 8, 96, 96, DType::F16),   // head dim
            AttentionProblem::uniform(1, 1, 64, 32, 1, 128, 128, DType::F16), // group 32
            AttentionProblem::uniform(1, 1, 64, 8, 8, 128, 128, DType::F32), // f32 on cuda
        ];
        for p in cases {
            match plan(&p, &hop) {
                Err(CoreError::Unsupported { supported, .. }) => assert!(!supported.is_empty()),
                other => panic!("{p:?} gave {other:?}"),
            }
        }
        // f32 is fine on the CPU
        let p = AttentionProblem::uniform(1, 1, 64, 8, 8, 128, 128, DType::F32);
        assert!(plan(&p, &DeviceCaps::cpu(2)).is_ok());
    }

    #[test]
    fn plan_round_trips_through_json_and_stays_small() {
        let p = AttentionProblem::uniform(32, 1, 262_144, 32, 8, 128, 128, DType::F16);
        let pl = plan(&p, &DeviceCaps::hopper_reference()).unwrap();
        assert_eq!(pl.num_ctas, 264);
        // few uniform tiles: the grid is a multiple of the tile count that runs one CTA per SM,
        // no CTA straddles two tiles
        let small = AttentionProblem::uniform(1, 1, 1024, 56, 56, 64, 64, DType::F16);
        let ps = plan(&small, &DeviceCaps::hopper_reference()).unwrap();
        assert_eq!(
            (ps.tile_space(&small).total_iters(), ps.num_ctas),
            (448, 112)
        );
        let segs = ps.schedule.segments(&ps.tile_space(&small));
        assert_eq!(segs.len(), 112, "one segment per CTA");
        assert!(segs.iter().all(|s| s.local_end - s.local_begin == 4));
        // fewer iterations than slots: one CTA per iteration
        let tiny = AttentionProblem::uniform(1, 1, 1024, 32, 8, 128, 128, DType::F16);
        assert_eq!(
            plan(&tiny, &DeviceCaps::hopper_reference())
                .unwrap()
                .num_ctas,
            128
        );
        // much work per slot: the whole grid
        let long = AttentionProblem::uniform(1, 1, 65536, 56, 56, 64, 64, DType::F16);
        assert_eq!(
            plan(&long, &DeviceCaps::hopper_reference())
                .unwrap()
                .num_ctas,
            264
        );
        let json = serde_json::to_string(&pl).unwrap();
        assert!(json.len() < 8 << 10, "{} bytes", json.len());
        assert_eq!(serde_json::from_str::<LeanPlan>(&json).unwrap(), pl);
        let fx = plan_fixed_split(&p, &DeviceCaps::hopper_reference(), None).unwrap();
        assert!(serde_json::to_string(&fx).unwrap().len() < 1024);
    }
}
