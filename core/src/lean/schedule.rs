//! The stream-K schedule of LeanAttention (Lean appendix E, Algorithm 2), and the fixed-split
//! (FlashDecoding) schedule it is measured against, as plain values.
//!
//! **Iteration space.** An *output tile* is one query-tile group of one KV head of one sequence:
//! up to `tile_m` query rows (the query heads sharing that KV head times the query tokens), so a
//! K/V load serves every query head of its group. Tiles are numbered
//! `tile = (b * heads_kv + hk) * query_groups + qg`. Tile `t` of sequence `b` needs
//! `n(b) = max(1, ceil(seqlens_k[b] / tile_k))` LeanTile iterations (Alg. 2 line 5, `C_n`, made
//! ragged; an empty sequence still gets one iteration so that some CTA writes its O = 0 and
//! LSE = -inf). Laying the tiles end to end gives a flat iteration space `[0, I)` (line 6).
//!
//! **Stream-K.** CTA `g` of `G` owns the contiguous range `[cta_bounds[g], cta_bounds[g + 1])`,
//! with every range `floor(I/G)` or `ceil(I/G)` long (line 9). Within its range a CTA walks the
//! tiles it touches, computing one *segment* per tile (lines 10-16). The CTA whose segment starts
//! a tile is that tile's **host block** (line 17); the one whose segment ends it is the
//! **finishing block** (line 18). Every other segment of the tile is written as a partial
//! `(O, m, l)` to the slot of the CTA that computed it (lines 19-23); a host that is not also the
//! finishing block waits for CTAs `g + 1 ..= last_cta` and merges their partials in that order
//! (lines 25-36) before writing `O / l` and `LSE = m + ln l` (lines 37-39). Since a CTA can start
//! mid-tile only once, each CTA stores at most one partial: its first segment.
//!
//! **Fixed split.** FlashDecoding cuts every tile into chunks of `chunk_iters` iterations and gives
//! each chunk its own CTA; the chunk count is picked once from the longest sequence, so short
//! sequences leave SMs idle. It is expressed in the same iteration space (CTA ranges never cross a
//! tile boundary) so that one kernel runs both; partials are merged by a second pass.
//!
//! Only the per-CTA bounds are stored (stream-K) or a single chunk length (fixed split); tile
//! offsets, segments and host/finishing roles are derived by [`TileSpace`] and [`Schedule::segments`].

use crate::{AttentionProblem, CoreError, Result};
use serde::{Deserialize, Serialize};

/// How the iteration space is cut into CTA work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum Schedule {
    /// Lean appendix Alg. 2: equal contiguous ranges of the flat iteration space.
    StreamK {
        /// Total LeanTile iterations `I` over all output tiles.
        total_iters: u64,
        /// `num_ctas + 1` ascending bounds: CTA `g` owns iterations `[b[g], b[g + 1])`.
        cta_bounds: Vec<u64>,
    },
    /// FlashDecoding: each tile is cut into chunks of `chunk_iters` iterations, one CTA per chunk.
    FixedSplit {
        /// Total LeanTile iterations `I` over all output tiles.
        total_iters: u64,
        /// Splits chosen for the longest sequence.
        splits: usize,
        /// Iterations per chunk: `ceil(max_b n(b) / splits)`.
        chunk_iters: u64,
        /// CTAs launched: `sum over tiles of ceil(n(tile) / chunk_iters)`.
        num_ctas: usize,
    },
}

/// The flat iteration space of a problem for given tile sizes (derived, never stored in a plan).
#[derive(Clone, Debug, PartialEq)]
pub struct TileSpace {
    /// Output tiles per sequence: `heads_kv * query_groups`.
    pub tiles_per_seq: usize,
    /// Query-tile groups per (sequence, KV head).
    pub query_groups: usize,
    /// Iterations of every tile of sequence `b`: `max(1, ceil(seqlens_k[b] / tile_k))`.
    pub iters: Vec<u64>,
    /// `batch + 1` prefix offsets: the tiles of sequence `b` occupy `[seq_start[b], seq_start[b+1])`.
    pub seq_start: Vec<u64>,
}

/// One CTA's work on one output tile (Alg. 2 lines 11-18).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The CTA computing it.
    pub cta: usize,
    /// Output tile index.
    pub tile: usize,
    /// First iteration, relative to the tile's start (`local_iter`).
    pub local_begin: u64,
    /// One past the last iteration, relative to the tile's start (`local_iter_end`).
    pub local_end: u64,
    /// Starts the tile: this CTA merges and writes the tile (line 17).
    pub host: bool,
    /// Ends the tile (line 18).
    pub finishing: bool,
}

impl TileSpace {
    /// The iteration space of `p` with `tile_k` keys per iteration and `query_groups` tiles per KV head.
    pub fn new(p: &AttentionProblem, tile_k: usize, query_groups: usize) -> TileSpace {
        let tiles_per_seq = p.heads_kv * query_groups;
        let iters: Vec<u64> = p
            .seqlens_k
            .iter()
            // tile_k = 0 is refused by LeanPlan::check; max(1) keeps this total anyway
            .map(|&l| (l.div_ceil(tile_k.max(1))).max(1) as u64)
            .collect();
        let mut seq_start = Vec::with_capacity(p.batch + 1);
        let mut acc = 0u64;
        seq_start.push(0);
        for &n in &iters {
            acc = acc.saturating_add(n.saturating_mul(tiles_per_seq as u64));
            seq_start.push(acc);
        }
        TileSpace {
            tiles_per_seq,
            query_groups,
            iters,
            seq_start,
        }
    }

    /// Total iterations `I`.
    pub fn total_iters(&self) -> u64 {
        *self
            .seq_start
            .last()
            .expect("seq_start has batch + 1 entries")
    }

    /// Number of output tiles.
    pub fn num_tiles(&self) -> usize {
        self.iters.len() * self.tiles_per_seq
    }

    /// `(b, hk, qg)` of a tile.
    pub fn tile_coords(&self, tile: usize) -> (usize, usize, usize) {
        let b = tile / self.tiles_per_seq;
        let r = tile % self.tiles_per_seq;
        (b, r / self.query_groups, r % self.query_groups)
    }

    /// `[start, end)` of a tile in the flat iteration space.
    pub fn tile_range(&self, tile: usize) -> (u64, u64) {
        let b = tile / self.tiles_per_seq;
        let r = (tile % self.tiles_per_seq) as u64;
        let s = self.seq_start[b] + r * self.iters[b];
        (s, s + self.iters[b])
    }

    /// The tile holding flat iteration `iter < I`.
    pub fn tile_of(&self, iter: u64) -> usize {
        // last b with seq_start[b] <= iter (sequences of equal start are empty of tiles only when
        // tiles_per_seq is 0, which validation excludes)
        let b = self.seq_start.partition_point(|&s| s <= iter) - 1;
        let r = (iter - self.seq_start[b]) / self.iters[b];
        b * self.tiles_per_seq + r as usize
    }
}

impl Schedule {
    /// Stream-K over `ctas` CTAs (fewer when there are fewer iterations than CTAs).
    pub fn stream_k(space: &TileSpace, ctas: usize) -> Schedule {
        let total = space.total_iters();
        let g = (ctas as u64).min(total).max(1);
        // floor(i * I / G): ranges differ in length by at most one iteration (Alg. 2 line 9)
        let cta_bounds = (0..=g)
            .map(|i| ((i as u128 * total as u128) / g as u128) as u64)
            .collect();
        Schedule::StreamK {
            total_iters: total,
            cta_bounds,
        }
    }

    /// FlashDecoding's fixed split with `splits` chunks for the longest sequence.
    pub fn fixed_split(space: &TileSpace, splits: usize) -> Schedule {
        let max_iters = space.iters.iter().copied().max().unwrap_or(1);
        let splits = splits.clamp(1, max_iters as usize);
        let chunk_iters = max_iters.div_ceil(splits as u64);
        let num_ctas = space
            .iters
            .iter()
            .map(|&n| n.div_ceil(chunk_iters) as usize * space.tiles_per_seq)
            .sum();
        Schedule::FixedSplit {
            total_iters: space.total_iters(),
            splits,
            chunk_iters,
            num_ctas,
        }
    }

    /// Checks a schedule from outside against the iteration space it is to cover: every tile's
    /// iterations exactly once and in order, each CTA at least one iteration (stream-K: bounds
    /// from 0 to `I`, strictly ascending; fixed split: exactly what [`Schedule::fixed_split`]
    /// makes of its `splits`). A schedule that passes cannot make [`Schedule::segments`] loop or
    /// index outside the space.
    pub fn check(&self, space: &TileSpace) -> Result<()> {
        let bad = |m: String| Err(CoreError::InvalidPlan(format!("lean schedule: {m}")));
        let total = space.total_iters();
        match self {
            Schedule::StreamK {
                total_iters,
                cta_bounds,
            } => {
                if *total_iters != total {
                    return bad(format!(
                        "total_iters = {total_iters} but the problem has {total} iterations (plan made for another problem?)"
                    ));
                }
                if cta_bounds.len() < 2
                    || cta_bounds[0] != 0
                    || *cta_bounds.last().expect("len >= 2") != total
                {
                    return bad(format!(
                        "cta_bounds {} must run from 0 to total_iters = {total} with at least one CTA",
                        short(cta_bounds)
                    ));
                }
                if let Some(g) = cta_bounds.windows(2).position(|w| w[0] >= w[1]) {
                    return bad(format!(
                        "cta_bounds[{g}] = {} is not below cta_bounds[{}] = {}; every CTA owns at least one iteration, in order",
                        cta_bounds[g],
                        g + 1,
                        cta_bounds[g + 1]
                    ));
                }
                Ok(())
            }
            Schedule::FixedSplit { splits, .. } => {
                let want = Schedule::fixed_split(space, *splits);
                if *self != want {
                    return bad(format!(
                        "{self:?} is not the fixed split of this problem for its splits = {splits}: {want:?}"
                    ));
                }
                Ok(())
            }
        }
    }

    /// CTAs in the grid.
    pub fn num_ctas(&self) -> usize {
        match self {
            Schedule::StreamK { cta_bounds, .. } => cta_bounds.len().saturating_sub(1),
            Schedule::FixedSplit { num_ctas, .. } => *num_ctas,
        }
    }

    /// Whether partials are merged inside the same launch by host blocks (stream-K) or by a
    /// second pass (fixed split).
    pub fn merges_in_kernel(&self) -> bool {
        matches!(self, Schedule::StreamK { .. })
    }

    /// Whether every CTA computes exactly one whole tile (a fixed split of one chunk per tile):
    /// CTA `g` is tile `g`, nothing is stored as a partial or merged, and no table per CTA is
    /// needed.
    pub fn one_cta_per_tile(&self, space: &TileSpace) -> bool {
        matches!(self, Schedule::FixedSplit { num_ctas, .. } if *num_ctas == space.num_tiles())
    }

    /// The `num_ctas + 1` CTA bounds in the flat iteration space (expanded for fixed split).
    pub fn cta_bounds(&self, space: &TileSpace) -> Vec<u64> {
        match self {
            Schedule::StreamK { cta_bounds, .. } => cta_bounds.clone(),
            Schedule::FixedSplit {
                chunk_iters,
                num_ctas,
                ..
            } => {
                let mut b = Vec::with_capacity(num_ctas + 1);
                for t in 0..space.num_tiles() {
                    let (s, e) = space.tile_range(t);
                    let mut x = s;
                    while x < e {
                        b.push(x);
                        // chunk_iters = 0 is refused by Schedule::check; max(1) keeps this finite
                        x = (x + (*chunk_iters).max(1)).min(e);
                    }
                }
                b.push(space.total_iters());
                b
            }
        }
    }

    /// Every segment, in CTA order and, within a CTA, in iteration order (Alg. 2 lines 10-42).
    pub fn segments(&self, space: &TileSpace) -> Vec<Segment> {
        let bounds = self.cta_bounds(space);
        let total = space.total_iters();
        let mut out = Vec::new();
        for g in 0..bounds.len().saturating_sub(1) {
            // bounds outside [0, I] are refused by Schedule::check; clamping keeps this in range
            let (cta_start, cta_end) = (bounds[g], bounds[g + 1].min(total));
            let mut iter = cta_start;
            while iter < cta_end {
                let tile = space.tile_of(iter);
                let (tile_start, tile_end) = space.tile_range(tile);
                let end = tile_end.min(cta_end);
                out.push(Segment {
                    cta: g,
                    tile,
                    local_begin: iter - tile_start,
                    local_end: end - tile_start,
                    host: iter == tile_start,
                    finishing: cta_end >= tile_end,
                });
                iter = end;
            }
        }
        out
    }
}

/// A bounds list for a message: all of it when short, else its ends and length.
fn short(b: &[u64]) -> String {
    if b.len() <= 8 {
        format!("{b:?}")
    } else {
        format!(
            "[{}, {}, .., {}] ({} entries)",
            b[0],
            b[1],
            b[b.len() - 1],
            b.len()
        )
    }
}

/// The schedule as the CUDA kernel reads it: 32-bit tables, so that no CTA searches or derives
/// anything it can be given (see `cuda-kernels/lean_decode.cu`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelTables {
    /// `batch + 1` entries: first flat iteration of each sequence's tiles.
    pub seq_start: Vec<u32>,
    /// `num_ctas + 1` entries: CTA `g` owns iterations `[cta_bounds[g], cta_bounds[g + 1])`.
    pub cta_bounds: Vec<u32>,
    /// `2 * num_ctas` entries: per CTA, its first tile, then the last CTA whose partial the host
    /// of its last hosted tile merges (the CTA itself when that tile finishes in its own range).
    pub cta_tiles: Vec<u32>,
}

impl Schedule {
    /// The kernel's tables for this schedule over `space`; `None` when the iteration space does
    /// not fit in 32 bits (the kernel counts iterations in `u32`).
    pub fn kernel_tables(&self, space: &TileSpace) -> Option<KernelTables> {
        if space.total_iters() >= u32::MAX as u64 {
            return None;
        }
        let bounds: Vec<u32> = self.cta_bounds(space).iter().map(|&b| b as u32).collect();
        let g = bounds.len() - 1;
        let mut cta_tiles = vec![0u32; 2 * g];
        let mut seen = vec![false; g];
        for seg in self.segments(space) {
            let c = seg.cta;
            if !seen[c] {
                seen[c] = true;
                cta_tiles[2 * c] = seg.tile as u32;
            }
            // segments come in iteration order: a CTA's last one decides what its host waits for
            let te = space.tile_range(seg.tile).1;
            cta_tiles[2 * c + 1] = if seg.host && !seg.finishing {
                (bounds.partition_point(|&b| (b as u64) < te) - 1) as u32
            } else {
                c as u32
            };
        }
        Some(KernelTables {
            seq_start: space.seq_start.iter().map(|&b| b as u32).collect(),
            cta_bounds: bounds,
            cta_tiles,
        })
    }
}

/// FlashDecoding's split count (the FlashAttention-2 `num_splits` heuristic): no split when the
/// tiles already fill 80% of the CTA slots; otherwise the fewest splits whose wave efficiency
/// (`waves / ceil(waves)`) is within 85% of the best, up to `max_splits`.
pub fn fixed_split_count(
    num_tiles: usize,
    slots: usize,
    max_iters: u64,
    max_splits: usize,
) -> usize {
    if num_tiles as f64 >= 0.8 * slots as f64 {
        return 1;
    }
    let cap = max_splits.min(slots).min(max_iters as usize).max(1);
    let eff = |s: usize| {
        let waves = (num_tiles * s) as f64 / slots as f64;
        waves / waves.ceil()
    };
    // a split count that does not shorten the longest chunk is no different from one fewer
    let useful =
        |s: usize| s == 1 || max_iters.div_ceil(s as u64) != max_iters.div_ceil(s as u64 - 1);
    let best = (1..=cap)
        .filter(|&s| useful(s))
        .map(eff)
        .fold(0.0, f64::max);
    (1..=cap)
        .find(|&s| useful(s) && eff(s) >= 0.85 * best)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn ragged(lens: &[usize], hk: usize) -> AttentionProblem {
        let mut p = AttentionProblem::uniform(
            lens.len(),
            1,
            *lens.iter().max().unwrap(),
            hk,
            hk,
            64,
            64,
            DType::F16,
        );
        p.seqlens_k = lens.to_vec();
        p
    }

    #[test]
    fn stream_k_covers_every_iteration_once_with_balanced_ranges() {
        let p = ragged(&[300, 1, 0, 1000], 3);
        let space = TileSpace::new(&p, 64, 1);
        // n = 5, 1, 1, 16 per tile, 3 tiles each
        assert_eq!(space.iters, vec![5, 1, 1, 16]);
        assert_eq!(space.total_iters(), 3 * (5 + 1 + 1 + 16));
        for ctas in [1, 2, 7, 13, 69, 500] {
            let s = Schedule::stream_k(&space, ctas);
            let b = s.cta_bounds(&space);
            assert_eq!(b.len(), s.num_ctas() + 1);
            assert_eq!((b[0], *b.last().unwrap()), (0, space.total_iters()));
            let lens: Vec<u64> = b.windows(2).map(|w| w[1] - w[0]).collect();
            assert!(
                lens.iter().max().unwrap() - lens.iter().min().unwrap() <= 1,
                "{lens:?}"
            );
            // every tile: exactly one host, one finishing segment, contiguous coverage
            let segs = s.segments(&space);
            for t in 0..space.num_tiles() {
                let ts: Vec<_> = segs.iter().filter(|x| x.tile == t).collect();
                let (st, en) = space.tile_range(t);
                assert_eq!(ts.iter().filter(|x| x.host).count(), 1);
                assert_eq!(ts.iter().filter(|x| x.finishing).count(), 1);
                assert!(ts[0].host && ts.last().unwrap().finishing);
                let mut at = 0;
                for x in &ts {
                    assert_eq!(x.local_begin, at);
                    at = x.local_end;
                }
                assert_eq!(at, en - st);
                // a CTA stores at most one partial: a non-host segment is its first one
                for x in ts.iter().filter(|x| !x.host) {
                    assert_eq!(segs.iter().find(|y| y.cta == x.cta).unwrap(), *x);
                }
            }
        }
    }

    #[test]
    fn fixed_split_ranges_stay_inside_tiles() {
        let p = ragged(&[4096, 100, 2000], 2);
        let space = TileSpace::new(&p, 64, 1);
        let s = Schedule::fixed_split(&space, 8);
        let Schedule::FixedSplit {
            chunk_iters,
            num_ctas,
            ..
        } = s
        else {
            unreachable!()
        };
        assert_eq!(chunk_iters, 8);
        // 4096/64 = 64 iterations -> 8 chunks; 100 -> 2 iterations -> 1 chunk; 2000 -> 32 -> 4
        assert_eq!(num_ctas, 2 * (8 + 1 + 4));
        for seg in s.segments(&space) {
            assert!(seg.local_end - seg.local_begin <= chunk_iters);
            assert_eq!(seg.host, seg.local_begin == 0);
        }
    }

    #[test]
    fn one_split_is_one_cta_per_tile() {
        let p = ragged(&[1024, 100, 3000], 4);
        let space = TileSpace::new(&p, 64, 1);
        let s = Schedule::fixed_split(&space, 1);
        assert!(s.one_cta_per_tile(&space));
        s.check(&space).unwrap();
        for (g, seg) in s.segments(&space).iter().enumerate() {
            assert_eq!((seg.cta, seg.tile), (g, g));
            assert!(seg.host && seg.finishing);
        }
        assert!(!Schedule::fixed_split(&space, 2).one_cta_per_tile(&space));
        assert!(!Schedule::stream_k(&space, space.num_tiles()).one_cta_per_tile(&space));
    }

    #[test]
    fn tile_of_inverts_tile_range() {
        let p = ragged(&[65, 0, 129, 64], 2);
        let space = TileSpace::new(&p, 64, 3);
        for t in 0..space.num_tiles() {
            let (s, e) = space.tile_range(t);
            for i in s..e {
                assert_eq!(space.tile_of(i), t);
            }
        }
        assert_eq!(space.tile_coords(5), (0, 1, 2));
        assert_eq!(space.tile_coords(6), (1, 0, 0));
    }

    #[test]
    fn split_heuristic_splits_small_grids_only() {
        // batch 1, 8 KV heads, 1024 iterations on 264 slots: splits to fill the machine
        let s = fixed_split_count(8, 264, 1024, 128);
        assert!(s >= 16 && (8 * s) as f64 / 264.0 > 0.7, "{s}");
        assert_eq!(fixed_split_count(1024, 264, 1024, 128), 1);
        assert_eq!(fixed_split_count(8, 264, 1, 128), 1);
    }
}
