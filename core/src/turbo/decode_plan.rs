//! The schedule of the TurboAttention decode kernel (`cuda-kernels/turbo_decode.cu`), planned on
//! the host, and its CPU twin.
//!
//! Alg. 2 of TurboAttention walks, per (sequence, KV head, group of query heads) -- an *output
//! tile* -- the cache tiles in token order: every compressed block of [`DECODE_BLOCK`] tokens,
//! then the INT8 buffer. The decode kernel lays those iterations end to end
//! ([`crate::lean::TileSpace`] with 64-token tiles) and cuts the space into the ranges of
//! *units* (one warp each): one unit per output tile (the emulation's order, O bit for bit) or
//! stream-K (LeanAttention appendix E) with the partials merged in key order. [`decode_twin`]
//! replays a plan on the CPU with the emulation's [`attend_tile`], so a stream-K launch has an
//! exact reference too. Everything here is pure host code; the CUDA backend re-exports it.

use super::attention::{attend_tile, RowState};
use super::quant::Int8Block;
use super::{TurboConfig, TurboKvCache};
use crate::lean::{Schedule, Segment, TileSpace};
use crate::{AttentionProblem, CoreError, DType, Tensor};

/// Tokens per cache tile of the decode (`kBlock`; `n_b` and the buffer capacity of the CUDA cache).
pub const DECODE_BLOCK: usize = 64;
/// Query heads of one KV head that one decode unit (warp) holds as MMA rows (`kUnitRows` of
/// turbo_decode.cu; a larger GQA group is split into several output tiles).
pub const DECODE_ROWS: usize = 8;
/// Warps per decode CTA: each warp is one unit of the decode schedule (`kUnitsPerCta`).
pub const DECODE_UNITS_PER_CTA: usize = 4;

/// How the decode iterations (cache tiles of every output tile) are cut into CTA work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeSchedule {
    /// One unit (warp) per output tile: the emulation's tile order, O bit for bit.
    PerTile,
    /// Stream-K (Lean appendix E, Alg. 2 line 9) over this many units (warps, four per CTA):
    /// equal contiguous ranges of the iteration space, partials merged in key order; equals
    /// [`decode_twin`] bit for bit.
    StreamK(usize),
    /// Stream-K over at most `units` units (a few fewer where units hold one or two cache tiles
    /// each and the shares outrun the tiles) whose contiguous ranges are cut to equal shares of the cost under `costs` (a cache tile,
    /// the INT8 buffer tile, each segment a unit starts: its query quantization and partial
    /// write) instead of equal iteration counts, no unit over the least cost limit a greedy cut
    /// into `units` needs; partials merged in key order as under [`DecodeSchedule::StreamK`], so
    /// [`decode_twin`] is its reference too.
    Balanced {
        /// Most units (warps) of the launch.
        units: usize,
        /// What a unit's work costs.
        costs: DecodeCosts,
    },
}

/// What a decode unit's work costs, in sixteenths of a compressed 64-token cache tile, for
/// [`DecodeSchedule::Balanced`]'s cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeCosts {
    /// A compressed cache tile (INT4 or INT2 codes).
    pub tile: u64,
    /// The INT8 buffer tile (the last tile of a sequence whose length is not a multiple of 64).
    pub buffer_tile: u64,
    /// Each segment a unit computes: the query quantization at its start and the partial
    /// written at its end.
    pub segment: u64,
}

/// The costs [`decode_units`] balances with: a buffer tile 21 / 16 of a cache tile, a segment
/// 7 / 16, from the instructions Nsight Compute counted at 64 x 4k on an H200 (decode15: the
/// buffer tile's q K^T and P V about 930 warp instructions against about 590 for a compressed
/// tile's, of about 960 a tile in all; a segment's start about 250 and its partial write about
/// 170). Measured against 28 / 7 and 24 / 12 (issue 11, docs/TURBO_CUDA.md "Decode: a stream-K
/// cut by cost").
pub const DECODE_COSTS: DecodeCosts = DecodeCosts {
    tile: 16,
    buffer_tile: 21,
    segment: 7,
};

/// The largest cost [`plan_decode`] takes for any of [`DecodeCosts`]' fields (a tile and the
/// buffer tile cost at least 1, a segment may cost 0), so that the cut's sums stay far inside
/// `u64` for any plan (fewer than 2^32 cache tiles, at most 2^32 units).
pub const DECODE_COST_MAX: u64 = 1 << 16;

/// A decode launch planned on the host: the iteration space over the cache tiles
/// (`ferrattn_core::lean::TileSpace` with 64-token tiles), the ranges of the schedule's units and
/// the partial slots. A unit of the schedule is one warp of the decode kernel (warp `w` of CTA
/// `c` is unit `4 c + w`); the core's "CTA" fields below count units.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodePlan {
    /// Query heads.
    pub heads_q: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Cache tokens per sequence; 0 for a sequence this launch does not decode.
    pub lens: Vec<usize>,
    /// Query token each sequence decodes, -1 for none.
    pub q_tok: Vec<i32>,
    /// Output tiles per KV head: `ceil(group / 16)`.
    pub qgroups: usize,
    /// The iteration space.
    pub space: TileSpace,
    /// The CTA ranges.
    pub schedule: Schedule,
    /// `num_ctas + 1` bounds of the units' ranges.
    pub cta_bounds: Vec<u64>,
    /// Every segment in slot order (unit order, then iteration order).
    pub segments: Vec<Segment>,
    /// Slot of each unit's first segment.
    pub cta_slot: Vec<u32>,
    /// `num_tiles + 1`: the slots of tile `t` are `tile_slot[t] .. tile_slot[t + 1]`.
    pub tile_slot: Vec<u32>,
}

impl DecodePlan {
    /// Units (warps) of the decode launch.
    pub fn num_ctas(&self) -> usize {
        self.cta_bounds.len() - 1
    }
    /// CTAs of the decode launch: [`DECODE_UNITS_PER_CTA`] units each.
    pub fn grid_ctas(&self) -> usize {
        self.num_ctas().div_ceil(DECODE_UNITS_PER_CTA)
    }
    /// Output tiles (and CTAs of the combine launch).
    pub fn num_tiles(&self) -> usize {
        self.space.num_tiles()
    }
    /// Partial slots.
    pub fn slots(&self) -> usize {
        self.segments.len()
    }
}

/// Cache tiles a stream-K unit should get at least: below that the per-segment work (query
/// quantization, partial write) and the combine's merge of many partials cost more than the
/// extra parallelism gains. 4 (was 8) since the folded decode of issue 11: a 64-token tile costs
/// 1,796 warp instructions instead of about 3,000, so a unit's tiles finish sooner and batch 1
/// needs more units in flight (1 x 16k on an H100: 72.6 us with 256 units, 67.0 us with 512,
/// the kernel change included; docs/TURBO_CUDA.md).
pub const DECODE_MIN_ITERS_PER_UNIT: u64 = 4;

/// Cache tiles a stream-K unit gets where that still launches at least half the resident units:
/// at 4 x 16k (8,192 cache tiles) on an H200, 1,024 units of 8 tiles were 10% faster than 1,584
/// of about 5 with both caches, while at batch 1 (2,048 tiles) 256 units of 8 were 5% slower than
/// 512 of 4 (issue 11, docs/TURBO_CUDA.md "Decode: a stream-K cut by cost").
pub const DECODE_ITERS_PER_UNIT: u64 = 8;

/// The automatic decode schedule for `resident` units (warps that fit on the GPU at once),
/// `tiles` output tiles and `iters` cache tiles in all: one unit per output tile when the tiles
/// fill the GPU (the emulation's order), else the balanced stream-K cut
/// ([`DecodeSchedule::Balanced`] under [`DECODE_COSTS`]) over [`DECODE_ITERS_PER_UNIT`] cache
/// tiles a unit where that gives at least half of `resident` units, else over
/// [`DECODE_MIN_ITERS_PER_UNIT`]; at most `resident` units and at least `tiles`.
pub fn decode_units(resident: usize, tiles: usize, iters: u64) -> DecodeSchedule {
    if tiles >= resident {
        return DecodeSchedule::PerTile;
    }
    let long = iters.div_ceil(DECODE_ITERS_PER_UNIT);
    let by_work = if long >= (resident / 2) as u64 {
        long
    } else {
        iters.div_ceil(DECODE_MIN_ITERS_PER_UNIT)
    };
    DecodeSchedule::Balanced {
        units: (by_work.min(resident as u64) as usize).max(tiles).max(1),
        costs: DECODE_COSTS,
    }
}

/// Plans a decode launch. `lens[b]`: tokens the cache holds for sequence `b`; `q_tok[b]`: the
/// query token it decodes, or -1 (its length is then treated as 0).
pub fn plan_decode(
    lens: &[usize],
    q_tok: &[i32],
    heads_q: usize,
    heads_kv: usize,
    schedule: DecodeSchedule,
) -> Result<DecodePlan, CoreError> {
    if lens.len() != q_tok.len() {
        return Err(CoreError::Shape {
            tensor: "q_tok",
            actual: vec![q_tok.len()],
            expected: format!("one query token per sequence (lens has {})", lens.len()),
        });
    }
    if heads_kv == 0 || heads_q == 0 || !heads_q.is_multiple_of(heads_kv) {
        return Err(CoreError::HeadRatio { heads_q, heads_kv });
    }
    let batch = lens.len();
    let lens: Vec<usize> = lens
        .iter()
        .zip(q_tok)
        .map(|(&l, &t)| if t < 0 { 0 } else { l })
        .collect();
    let group = heads_q / heads_kv;
    let qgroups = group.div_ceil(DECODE_ROWS);
    let max = lens.iter().copied().max().unwrap_or(0).max(1);
    // the core's iteration space needs only lengths and head counts from a problem
    let mut p = AttentionProblem::uniform(batch, 1, max, heads_q, heads_kv, 64, 64, DType::F16);
    p.seqlens_k = lens.clone();
    let space = TileSpace::new(&p, DECODE_BLOCK, qgroups);
    if space.total_iters() >= u32::MAX as u64 {
        return Err(CoreError::Unsupported {
            what: format!("{} decode iterations", space.total_iters()),
            supported: "fewer than 2^32".into(),
        });
    }
    if let DecodeSchedule::Balanced { units, costs } = schedule {
        let priced = |c: u64| (1..=DECODE_COST_MAX).contains(&c);
        if !priced(costs.tile)
            || !priced(costs.buffer_tile)
            || costs.segment > DECODE_COST_MAX
            || units as u64 > u64::from(u32::MAX)
        {
            return Err(CoreError::Unsupported {
                what: format!("a balanced decode cut over {units} units with {costs:?}"),
                supported: format!(
                    "at most 2^32 - 1 units; tile and buffer_tile costs 1 to {DECODE_COST_MAX}, \
                     a segment's 0 to {DECODE_COST_MAX}"
                ),
            });
        }
    }
    let schedule = match schedule {
        DecodeSchedule::PerTile => Schedule::fixed_split(&space, 1),
        DecodeSchedule::StreamK(ctas) => Schedule::stream_k(&space, ctas.max(1)),
        DecodeSchedule::Balanced { units, costs } => Schedule::StreamK {
            total_iters: space.total_iters(),
            cta_bounds: balanced_bounds(&space, &lens, units.max(1), costs),
        },
    };
    let cta_bounds = schedule.cta_bounds(&space);
    let segments = schedule.segments(&space);
    let mut cta_slot = vec![u32::MAX; cta_bounds.len() - 1];
    let mut tile_slot = vec![u32::MAX; space.num_tiles() + 1];
    for (i, s) in segments.iter().enumerate() {
        if cta_slot[s.cta] == u32::MAX {
            cta_slot[s.cta] = i as u32;
        }
        if tile_slot[s.tile] == u32::MAX {
            tile_slot[s.tile] = i as u32;
        }
    }
    tile_slot[space.num_tiles()] = segments.len() as u32;
    debug_assert!(
        cta_slot.iter().chain(&tile_slot).all(|&s| s != u32::MAX),
        "every CTA and tile has a segment"
    );
    Ok(DecodePlan {
        heads_q,
        heads_kv,
        lens,
        q_tok: q_tok.to_vec(),
        qgroups,
        space,
        schedule,
        cta_bounds,
        segments,
        cta_slot,
        tile_slot,
    })
}

/// Sequence `b`'s cache tiles as (compressed, buffer): its last tile is the INT8 buffer tile
/// where its length is not a multiple of [`DECODE_BLOCK`]; and the cost of its first tile.
fn seq_tiles(space: &TileSpace, lens: &[usize], b: usize, costs: DecodeCosts) -> (u64, u64, u64) {
    let n = space.iters[b];
    let buffer = u64::from(!lens[b].is_multiple_of(DECODE_BLOCK));
    let compressed = n - buffer;
    let first = if compressed > 0 {
        costs.tile
    } else {
        costs.buffer_tile
    };
    (compressed, buffer, first)
}

/// The cut into units of one cost limit: greedily, each unit takes tiles while its cost (each
/// segment it starts, each tile it computes) stays within `cap` (and at least one tile). Returns
/// the number of units; with `bounds`, pushes each unit's first iteration after the first's.
fn greedy_cut(
    space: &TileSpace,
    lens: &[usize],
    costs: DecodeCosts,
    cap: u64,
    mut bounds: Option<&mut Vec<u64>>,
) -> usize {
    let mut units = 1;
    let (mut cost, mut empty, mut at) = (costs.segment, true, 0u64);
    let mut cut = |at: u64, cost: &mut u64, empty: &mut bool, units: &mut usize| {
        *units += 1;
        *cost = costs.segment;
        *empty = true;
        if let Some(b) = bounds.as_deref_mut() {
            b.push(at);
        }
    };
    for b in 0..space.iters.len() {
        let (compressed, buffer, first) = seq_tiles(space, lens, b, costs);
        for _ in 0..space.tiles_per_seq {
            // entering an output tile starts a segment
            if !empty {
                if cost + costs.segment + first > cap {
                    cut(at, &mut cost, &mut empty, &mut units);
                } else {
                    cost += costs.segment;
                }
            }
            let mut left = compressed;
            while left > 0 {
                let fit = (cap.saturating_sub(cost) / costs.tile.max(1)).min(left);
                let take = if fit == 0 && empty { 1 } else { fit };
                cost += take * costs.tile;
                left -= take;
                at += take;
                empty &= take == 0;
                if left > 0 {
                    cut(at, &mut cost, &mut empty, &mut units);
                }
            }
            if buffer == 1 {
                if !empty && cost + costs.buffer_tile > cap {
                    cut(at, &mut cost, &mut empty, &mut units);
                }
                cost += costs.buffer_tile;
                at += 1;
                empty = false;
            }
        }
    }
    units
}

/// [`DecodeSchedule::Balanced`]'s `units + 1` bounds (fewer where the space has fewer cache
/// tiles than `units`): the iterations walked in order, each unit ending where the cost of the
/// units so far comes nearest to its share of the total, `(g + 1) / units` of it, or sooner where
/// it would cost more than the least limit within which [`greedy_cut`] needs no more than
/// `units` units; counting each segment a unit starts (its first, and each output tile it
/// enters) and each cache tile at its price. With equal prices and no segment cost these are the
/// equal cut's lengths. O(output tiles + units) a probe of the limit and for the walk.
fn balanced_bounds(
    space: &TileSpace,
    lens: &[usize],
    units: usize,
    costs: DecodeCosts,
) -> Vec<u64> {
    let mut walk = BalancedWalk::new(space, lens, units, costs);
    for b in 0..space.iters.len() {
        let (compressed, buffer, first) = seq_tiles(space, lens, b, costs);
        for _ in 0..space.tiles_per_seq {
            // the tile's first cache tile starts a segment; then its compressed tiles; then
            // the buffer tile
            walk.place(first, true);
            walk.place_run(costs.tile, compressed.saturating_sub(1));
            if buffer == 1 && compressed > 0 {
                walk.place(costs.buffer_tile, false);
            }
        }
    }
    walk.bounds.push(space.total_iters());
    walk.bounds
}

/// The state of [`balanced_bounds`]'s walk.
struct BalancedWalk {
    costs: DecodeCosts,
    /// Units of the cut (at most the space's cache tiles).
    units: u64,
    /// The total cost the shares divide.
    total: u64,
    /// The least greedy limit: no unit costs more (but the last).
    cap: u64,
    /// The current unit.
    g: u64,
    /// The cost of units 0..=g so far.
    acc: u64,
    /// The cost of unit g so far.
    unit: u64,
    /// Cache tiles placed.
    at: u64,
    bounds: Vec<u64>,
}

impl BalancedWalk {
    fn new(space: &TileSpace, lens: &[usize], units: usize, costs: DecodeCosts) -> BalancedWalk {
        let units = (units as u64).min(space.total_iters()).max(1);
        // the total: every tile entered once, every unit's start a segment of its own (an
        // overestimate by the cuts that fall on a tile's start)
        let mut total = (units - 1) * costs.segment;
        for b in 0..space.iters.len() {
            let (compressed, buffer, _) = seq_tiles(space, lens, b, costs);
            let tile = compressed * costs.tile + buffer * costs.buffer_tile + costs.segment;
            total += tile * space.tiles_per_seq as u64;
        }
        // the least cost limit of a cut into at most `units` (binary search: the greedy cut's
        // count does not grow with the limit; `total` fits one unit, and below the mean of the
        // cost without the cuts' segments none fits, which keeps every probe O(tiles + units))
        let least = (total - (units - 1) * costs.segment) / units;
        let (mut lo, mut hi) = (least.saturating_sub(1), total);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if greedy_cut(space, lens, costs, mid, None) <= units as usize {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        BalancedWalk {
            costs,
            units,
            total,
            cap: hi,
            g: 0,
            acc: 0,
            unit: 0,
            at: 0,
            bounds: vec![0],
        }
    }

    /// The cost the units 0..=g should reach.
    fn share(&self) -> u64 {
        ((self.g + 1) as u128 * self.total as u128 / self.units as u128) as u64
    }

    /// Whether an item that adds `add` is cut off to the next unit: units left, and the units so
    /// far nearer their share without it (`2 acc + add > 2 share`), or unit g over the limit.
    fn cuts(&self, add: u64) -> bool {
        self.g + 1 < self.units
            && (2 * self.acc + add > 2 * self.share() || self.unit + add > self.cap)
    }

    fn cut(&mut self, c: u64) {
        self.bounds.push(self.at);
        self.g += 1;
        self.acc += self.costs.segment + c;
        self.unit = self.costs.segment + c;
        self.at += 1;
    }

    /// One cache tile of cost `c`; `starts` where it is an output tile's first.
    fn place(&mut self, c: u64, starts: bool) {
        if self.at == 0 {
            // the first unit's own segment, and its first tile
            self.acc = self.costs.segment + c;
            self.unit = self.acc;
            self.at = 1;
            return;
        }
        let add = c + if starts { self.costs.segment } else { 0 };
        if self.cuts(add) {
            self.cut(c);
        } else {
            self.acc += add;
            self.unit += add;
            self.at += 1;
        }
    }

    /// `m` cache tiles of cost `c` inside an output tile, as `m` calls of
    /// [`BalancedWalk::place`] would place them, a cut at a time.
    fn place_run(&mut self, c: u64, mut m: u64) {
        while m > 0 {
            if self.at == 0 || self.g + 1 == self.units {
                // the first tile, or the last unit: no cut before it
                self.place(c, false);
                m -= 1;
                if self.g + 1 == self.units {
                    self.acc += m * c;
                    self.unit += m * c;
                    self.at += m;
                    return;
                }
                continue;
            }
            // tiles taken before the first i at which `cuts(c)` holds: 2 (acc + i c) + c >
            // 2 share, or unit + (i + 1) c > cap
            let sh = 2 * self.share();
            let by_share = if 2 * self.acc + c > sh {
                0
            } else {
                (sh - 2 * self.acc - c) / (2 * c.max(1)) + 1
            };
            let by_cap = if self.unit + c > self.cap {
                0
            } else {
                (self.cap - self.unit) / c.max(1)
            };
            let take = by_share.min(by_cap).min(m);
            self.acc += take * c;
            self.unit += take * c;
            self.at += take;
            m -= take;
            if m > 0 {
                self.cut(c);
                m -= 1;
            }
        }
    }
}

/// CPU twin of the decode kernel and its combine under `plan`: for each segment the core's
/// [`attend_tile`] over its cache tiles, then the partials of a tile merged in slot order with
/// the configuration's exponential exactly as `turbo_combine_*` merges them. `q` is
/// `[B, Sq, Hq, D]`; the rows `(b, plan.q_tok[b], h)` of `o` (`[B, Sq, Hq, D]`) and `lse`
/// (`[B, Hq, Sq]`) are written, O rounded to `o`'s dtype.
pub fn decode_twin(
    cfg: &TurboConfig,
    cache: &TurboKvCache,
    plan: &DecodePlan,
    q: &Tensor,
    softmax_scale: f32,
    o: &mut Tensor,
    lse: &mut Tensor,
) {
    let exp = cfg.exp_kind();
    let rescale = |m_old: f32, m_new: f32| {
        if m_old == m_new {
            1.0
        } else {
            exp.exp(m_old - m_new)
        }
    };
    let (hq, hk, d, sq) = (plan.heads_q, plan.heads_kv, cache.head_dim, q.shape[1]);
    let group = hq / hk;
    for t in 0..plan.num_tiles() {
        let (b, h_kv, qg) = plan.space.tile_coords(t);
        if plan.q_tok[b] < 0 {
            continue;
        }
        let qt = plan.q_tok[b] as usize;
        let (kt, vt) = cache.int8_tiles(b, h_kv);
        let rows = DECODE_ROWS.min(group - qg * DECODE_ROWS);
        for r in 0..rows {
            let h = h_kv * group + qg * DECODE_ROWS + r;
            let qb = Int8Block::quantize(&[q.row4(b, qt, h)]);
            let (mut m, mut l, mut a) = (f32::NEG_INFINITY, 0.0f32, vec![0.0f32; d]);
            for s in &plan.segments[plan.tile_slot[t] as usize..plan.tile_slot[t + 1] as usize] {
                let mut st = [RowState::new(d)];
                for ti in s.local_begin as usize..(s.local_end as usize).min(kt.len()) {
                    attend_tile(
                        &qb,
                        softmax_scale,
                        &[usize::MAX],
                        &kt[ti],
                        &vt[ti],
                        0,
                        exp,
                        &mut st,
                    );
                }
                let [st] = st;
                if st.m == f32::NEG_INFINITY {
                    continue;
                }
                if m == f32::NEG_INFINITY {
                    (m, l, a) = (st.m, st.l, st.acc);
                    continue;
                }
                let mn = m.max(st.m);
                let (r1, r2) = (rescale(m, mn), rescale(st.m, mn));
                l = st.l.mul_add(r2, l * r1);
                for (x, y) in a.iter_mut().zip(&st.acc) {
                    *x = y.mul_add(r2, *x * r1);
                }
                m = mn;
            }
            let empty = m == f32::NEG_INFINITY || l == 0.0;
            let dtype = o.dtype;
            for (c, dst) in o.row4_mut(b, qt, h).iter_mut().enumerate() {
                *dst = if empty { 0.0 } else { dtype.round(a[c] / l) };
            }
            lse.data[(b * hq + h) * sq + qt] = if empty { f32::NEG_INFINITY } else { m + l.ln() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // issue 9: caller input that used to panic (assert_eq!, a division by zero) is a typed error
    #[test]
    fn plan_decode_refuses_bad_input_with_typed_errors() {
        let e = plan_decode(&[5, 7], &[0], 8, 2, DecodeSchedule::PerTile).unwrap_err();
        assert!(
            matches!(e, CoreError::Shape { tensor: "q_tok", ref actual, .. } if actual == &[1])
        );
        assert!(e.to_string().contains("lens has 2"), "{e}");
        for (hq, hk) in [(8, 0), (0, 2), (8, 3)] {
            let e = plan_decode(&[5], &[0], hq, hk, DecodeSchedule::StreamK(4)).unwrap_err();
            assert_eq!(
                e,
                CoreError::HeadRatio {
                    heads_q: hq,
                    heads_kv: hk
                }
            );
        }
        assert!(plan_decode(&[5, 0], &[0, -1], 8, 2, DecodeSchedule::StreamK(4)).is_ok());
        let priced = |tile, buffer_tile, segment| DecodeCosts {
            tile,
            buffer_tile,
            segment,
        };
        for (units, costs) in [
            (4, priced(0, 21, 7)),
            (4, priced(16, 0, 7)),
            (4, priced(16, 21, DECODE_COST_MAX + 1)),
            (4, priced(u64::MAX, 21, 7)),
            (usize::MAX, DECODE_COSTS),
        ] {
            let e = plan_decode(
                &[5, 70],
                &[0, 1],
                8,
                2,
                DecodeSchedule::Balanced { units, costs },
            )
            .unwrap_err();
            assert!(
                matches!(e, CoreError::Unsupported { ref what, .. } if what.contains("balanced")),
                "{e}"
            );
        }
        for costs in [
            priced(1, 1, 0),
            DECODE_COSTS,
            priced(DECODE_COST_MAX, DECODE_COST_MAX, DECODE_COST_MAX),
        ] {
            let pl = plan_decode(
                &[5, 70],
                &[0, 1],
                8,
                2,
                DecodeSchedule::Balanced { units: 3, costs },
            )
            .unwrap();
            assert_eq!(*pl.cta_bounds.last().unwrap(), pl.space.total_iters());
        }
        // the most units it takes: no more units than cache tiles come out
        let units = u32::MAX as usize;
        let pl = plan_decode(
            &[5, 70],
            &[0, 1],
            8,
            2,
            DecodeSchedule::Balanced {
                units,
                costs: DECODE_COSTS,
            },
        )
        .unwrap();
        assert!(pl.num_ctas() as u64 <= pl.space.total_iters());
    }

    /// Each unit's cost under `costs`: a segment for each output tile it enters, its tiles.
    pub(super) fn unit_costs(pl: &DecodePlan, costs: DecodeCosts) -> Vec<u64> {
        let mut out = vec![0u64; pl.num_ctas()];
        for s in &pl.segments {
            let (b, _, _) = pl.space.tile_coords(s.tile);
            let n = pl.space.iters[b];
            let buffer = !pl.lens[b].is_multiple_of(DECODE_BLOCK);
            out[s.cta] += costs.segment;
            for i in s.local_begin..s.local_end {
                out[s.cta] += if buffer && i == n - 1 {
                    costs.buffer_tile
                } else {
                    costs.tile
                };
            }
        }
        out
    }

    /// [`balanced_bounds`] a cache tile at a time (the walk without its jumps).
    fn balanced_bounds_slow(
        space: &TileSpace,
        lens: &[usize],
        units: usize,
        costs: DecodeCosts,
    ) -> Vec<u64> {
        let mut walk = BalancedWalk::new(space, lens, units, costs);
        for (b, &n) in space.iters.iter().enumerate() {
            let buffer = !lens[b].is_multiple_of(DECODE_BLOCK);
            for _ in 0..space.tiles_per_seq {
                for i in 0..n {
                    let c = if buffer && i == n - 1 {
                        costs.buffer_tile
                    } else {
                        costs.tile
                    };
                    walk.place(c, i == 0);
                }
            }
        }
        walk.bounds.push(space.total_iters());
        walk.bounds
    }

    // the walk's jumps over a tile's compressed cache tiles place them as one at a time would
    #[test]
    fn balanced_walk_jumps_as_it_steps() {
        let cases: [(Vec<usize>, usize, usize); 6] = [
            (vec![4059; 64], 8, 1584),
            (vec![16347; 16], 8, 1584),
            (vec![16347; 4], 8, 1024),
            (vec![127, 639, 190, 0, 64, 4096, 1, 65], 4, 37),
            (vec![1, 2, 3], 2, 100),
            (vec![700, 5000], 2, 3),
        ];
        let steep = DecodeCosts {
            tile: 16,
            buffer_tile: 96,
            segment: 40,
        };
        let flat = DecodeCosts {
            tile: 1,
            buffer_tile: 1,
            segment: 0,
        };
        for (lens, hk, units) in cases {
            let q_tok: Vec<i32> = lens.iter().map(|&l| if l == 0 { -1 } else { 0 }).collect();
            for costs in [DECODE_COSTS, steep, flat] {
                let pl = plan_decode(
                    &lens,
                    &q_tok,
                    4 * hk,
                    hk,
                    DecodeSchedule::Balanced { units, costs },
                )
                .unwrap();
                let slow = balanced_bounds_slow(&pl.space, &pl.lens, units, costs);
                assert_eq!(pl.cta_bounds, slow, "{lens:?} {units} {costs:?}");
            }
        }
    }

    // the balanced cut covers every cache tile once in key order (the segments' own checks),
    // uses at most the units it is given, and its costliest unit costs no more than the equal
    // cut's under the same costs (less where buffer tiles and segment starts cluster)
    #[test]
    fn balanced_cut_covers_the_space_and_lowers_the_costliest_unit() {
        let cases: [(Vec<usize>, usize, usize, usize); 5] = [
            (vec![4059; 64], 32, 8, 1584),
            (vec![16347; 16], 32, 8, 1584),
            (vec![127, 639, 190, 0, 64, 4096], 16, 4, 37),
            (vec![1, 2, 3], 8, 2, 100),
            (vec![700], 40, 2, 3),
        ];
        for (lens, hq, hk, units) in cases {
            let q_tok: Vec<i32> = lens.iter().map(|&l| if l == 0 { -1 } else { 0 }).collect();
            let bal = DecodeSchedule::Balanced {
                units,
                costs: DECODE_COSTS,
            };
            let pl = plan_decode(&lens, &q_tok, hq, hk, bal).unwrap();
            pl.schedule.check(&pl.space).unwrap();
            assert!(pl.num_ctas() <= units, "{} units of {units}", pl.num_ctas());
            for t in 0..pl.num_tiles() {
                let segs = &pl.segments[pl.tile_slot[t] as usize..pl.tile_slot[t + 1] as usize];
                let mut at = 0;
                for s in segs {
                    assert_eq!((s.tile, s.local_begin), (t, at));
                    at = s.local_end;
                }
                let (b, _, _) = pl.space.tile_coords(t);
                assert_eq!(at, pl.space.iters[b], "tile {t} covered");
            }
            let eq = plan_decode(&lens, &q_tok, hq, hk, DecodeSchedule::StreamK(units)).unwrap();
            let (bal_max, eq_max) = (
                unit_costs(&pl, DECODE_COSTS).into_iter().max().unwrap(),
                unit_costs(&eq, DECODE_COSTS).into_iter().max().unwrap(),
            );
            assert!(bal_max <= eq_max, "{lens:?}: {bal_max} > {eq_max}");
        }
        // 64 x 4k: 512 output tiles of 63 cache tiles and a buffer tile over 1,584 units
        let lens = vec![4059; 64];
        let bal = DecodeSchedule::Balanced {
            units: 1584,
            costs: DECODE_COSTS,
        };
        let pl = plan_decode(&lens, &[0; 64], 32, 8, bal).unwrap();
        let eq = plan_decode(&lens, &[0; 64], 32, 8, DecodeSchedule::StreamK(1584)).unwrap();
        let costs = |p: &DecodePlan| unit_costs(p, DECODE_COSTS).into_iter().max().unwrap();
        assert!(costs(&pl) < costs(&eq), "{} vs {}", costs(&pl), costs(&eq));
        // equal costs and no segment cost: the equal cut's longest range
        let flat = DecodeCosts {
            tile: 1,
            buffer_tile: 1,
            segment: 0,
        };
        let pl = plan_decode(
            &lens,
            &[0; 64],
            32,
            8,
            DecodeSchedule::Balanced {
                units: 1584,
                costs: flat,
            },
        )
        .unwrap();
        let longest = |p: &DecodePlan| p.cta_bounds.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert_eq!(longest(&pl), longest(&eq));
    }
}
