//! TurboQuant on CUDA (issue 10): compression kernels and a fused decode over the compressed
//! cache (`cuda-kernels/turboquant_compress.cu`, `cuda-kernels/turboquant_decode.cu`; the kernel
//! files' headers give the dataflow). The contract is `ferrattn_core::turboquant`:
//!
//! * codes and norms equal [`TurboQuantCodec::compress`] bit for bit ([`DeviceTurboQuantCache::download`]
//!   turns the device layout back into the core's [`CompressedKv`]) on the default
//!   [`CompressPath::Exact`]; the tensor-core paths ([`CompressPath::Fast`], [`CompressPath::Split`])
//!   keep `‖x‖` bit-exact and codes, `‖r‖` and signs within the margins stated there;
//! * the decode equals [`TurboQuantCodec::attend`] up to the f16 rounding of the tensor-core
//!   operands (centroids, `p ‖v‖`, `S q`; `Π q` goes in as two f16 halves), split over the KV length with the core's stream-K
//!   schedule (`ferrattn_core::lean::Schedule::stream_k` over a `TileSpace` of 16-token
//!   iterations) and merged in key order by a second kernel.
//!
//! Closed list ([`check_supported`]): f16 inputs, `head_dim_qk = head_dim_v ∈ {64, 128}`, keys of
//! 2-4 bits with QJL (`m = d`) or without, values of 2-4 bits. Anything else is `Unsupported`.
//!
//! The cache ([`DeviceTurboQuantCache`]) is contiguous per (sequence, KV head) with a fixed
//! capacity; [`TurboQuantCuda::compress`] writes a prefill's tokens and
//! [`TurboQuantCuda::append`] a decode step's new tokens at each sequence's end.
//!
//! Files by concern: `support.rs` (the closed list and the kernel names), `contract.rs` (the
//! compression paths and their contract check, `FastDiv`, `CodeLut`), `params.rs` (the kernels'
//! parameter structs), `cache.rs` (the device cache), `step.rs` (step plans and prepared
//! launches), `engine.rs` ([`TurboQuantCuda`] and its launches), [`layout`], [`twin`] and the host
//! tests; this file keeps the schedule's constants, the stream-K tables and the host sizing
//! functions.

mod cache;
mod contract;
mod engine;
/// The device layout of the compressed cache and its host twin (what the kernels write and read;
/// see the header of `cuda-kernels/turboquant_compress.cu`).
pub mod layout;
mod params;
mod step;
mod support;
/// The decode kernels' slow twin: `turboquant_prepare_q`, `turboquant_decode` and
/// `turboquant_combine` simulated lane by lane on the host, over the device layout of the cache
/// (the bytes [`layout`] describes), with `prmt` byte selection and the `mma.m16n8k16` fragment
/// layouts of the PTX ISA. The MMAs are exact products accumulated in f32 (the tensor cores'
/// rounding differs in the last bits). Host tests hold it against the emulation, so the
/// fragment bookkeeping is checked on every machine, GPU or not.
#[allow(clippy::needless_range_loop)] // lane-indexed arrays mirror the kernel's registers
pub mod twin;

pub use self::cache::DeviceTurboQuantCache;
pub use self::contract::{
    check_compress_contract, CodeLut, CompressPath, ContractCounts, FastDiv, CODE_LUT_BINS,
    FAST_CODE_MARGIN, FAST_RNORM_REL, FAST_SIGN_MARGIN, SPLIT_CODE_MARGIN,
};
pub use self::engine::{PrepareKernel, TurboQuantCuda, PREPARE_SPREAD_MAX_TILES};
pub use self::params::{centroid_tables, f16_friendly_scale};
pub use self::step::{
    PreparedTurboQuantAppend, PreparedTurboQuantDecode, PreparedTurboQuantStep,
    TurboQuantAppendTables, TurboQuantDecodeTables, TurboQuantStepPlan, TURBOQUANT_WORKSPACE_ALIGN,
};
pub use self::support::{check_supported, code_crumbs, kernel_names, KernelNames};

use ferrattn_core::lean::{Schedule, TileSpace};
#[cfg(doc)] // intra-doc links only
use ferrattn_core::turboquant::{CompressedKv, TurboQuantCodec};
use ferrattn_core::AttentionProblem;
use half::f16;

/// MMA rows of one output tile (query heads of a KV group x query tokens).
pub const ROWS: usize = 16;
/// Tokens per decode iteration (one `n8` pair of `mma.m16n8k16`).
pub const TILE_K: usize = 16;
/// Warps (units) per CTA of the decode kernels: the 16-row ones (`decode_r16`, `kUnitWarps16`)
/// always, the <= 8-row ones (`decode_r8`) except at small work ([`small_decode`]). Those take
/// 4 to [`MAX_UNIT_WARPS_R8`] warps (`FERRATTN_TQ_UNIT_WARPS` forces one, a diagnostic): at
/// d = 128, 4-warp CTAs fit 3 per SM (12 warps; 4 at <= 128 registers). 7-warp CTAs at 128
/// registers, two per SM, measured slower at every shape (H200, issue-10-decode4 call 1); so
/// did 4 CTAs of 4 warps per SM at 128 registers (issue-10-decode6 call 1: 16 x 16k 141.4 ->
/// 146.0 µs).
pub const UNIT_WARPS: usize = 4;
/// Most warps per CTA of the <= 8-row decode kernels (`kMaxUnitWarps8`), and their CTA size at
/// small work: one 7-warp CTA per SM ([`small_decode`]).
pub const MAX_UNIT_WARPS_R8: usize = 7;

/// Whether `p`'s decode (at most 8 MMA rows in use) takes the small-work schedule on `sms` SMs:
/// one CTA of [`MAX_UNIT_WARPS_R8`] warps per SM, so 7 units per SM instead of every resident
/// warp (12 per SM at d = 128). Chosen where the default width would give every warp 2.5 to 24
/// iterations. Measured (k4q-v3, H200, the same kernels, one 7-warp CTA per SM with 924 units
/// against the 4-warp default width), issue-10-decode5 call 2: 1 x 8k (2.6 iterations a warp)
/// 22.8 against 24.9 µs a step, 1 x 64k and 4 x 16k (20.7) 49.8 and 55.0 against 51.6 and
/// 55.3, 1 x 128k (41) 79.9 against 77.4-77.5 (forced with `FERRATTN_TQ_UNIT_WARPS`), 1 x 16k
/// (5.2) 26.1-26.2 against main's 33.3-33.4 and 2 x 32k (20.7) 53.5 against 54.9 (de8498b's 5
/// to 24 rule); issue-10-decode4: 1 x 32k (10.3) 34.5 against 39.0, 16 x 16k and 32 x 32k (83
/// and 248) 7% and 11% slower. Fewer than 2.5 a warp (shorter contexts) and 24 to 41 were not
/// measured and keep the default.
pub fn small_decode(p: &AttentionProblem, sms: usize) -> bool {
    const DEFAULT_WARPS_PER_SM: usize = 12; // 3 CTAs of UNIT_WARPS at d = 128
    if p.group_size() * p.max_seqlen_q > 8 {
        return false;
    }
    let per_warp = decode_iterations(p) as f64 / (DEFAULT_WARPS_PER_SM * sms) as f64;
    (2.5..24.0).contains(&per_warp)
}
/// Stages of each decode warp's cp.async ring (`kStages` in turboquant_decode.cu).
pub const DECODE_STAGES: usize = 3;
/// Bytes of one ring stage (`kStageBytes`): 4 code slots of 16 bytes per lane (`kSlots`), then
/// 512 bytes for the 16 tokens' signs and norms (`kSmallBytes`, a 16-byte chunk per lane).
pub const DECODE_STAGE_BYTES: usize = 4 * 32 * 16 + 512;
/// Warps of a merge CTA of `turboquant_combine_d*` (`kCombineWarps`); the
/// `turboquant_combine_w16_d*` kernels have 16 (see [`merge_warps`]).
pub const COMBINE_WARPS: usize = 8;
/// Fewest 16-token iterations per decode unit the schedule aims at: fewer units than resident
/// warps when the work is small, so that each warp's ring runs long enough to pay for its fill
/// and the merge has fewer partials to read. 8 (was 16): at batch 1, 32k every resident warp
/// (3 CTAs per SM) runs ~10 iterations instead of 2 CTAs per SM running ~16; the decode loop is
/// issue-latency bound, so the third CTA's warps are worth more than a shorter prologue share.
pub const MIN_UNIT_ITERS: usize = 8;
/// Destination tokens per work item of the compression kernels.
pub const COMPRESS_TOKENS: usize = 16;
/// Destination tokens per tile of the fast compression kernels (one MMA `n8`).
pub const FAST_TILE: usize = 8;
/// Token rows per chunk of a fast compression CTA (`kRows` in turboquant_compress.cu).
pub const FAST_ROWS: usize = 64;
/// Threads of a fast compression CTA: one warpgroup (`tqf::kThreads`).
pub const FAST_THREADS: usize = 128;

/// The decode schedule as the kernels read it (host-side, pure).
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleTables {
    /// 16-row query groups per (sequence, KV head).
    pub qgroups: usize,
    /// Output tiles `(b · Hk + h) · qgroups + qg`.
    pub tiles: usize,
    /// Units (warps).
    pub units: usize,
    /// Per segment: tile, first token, end token, 0.
    pub segs: Vec<i32>,
    /// `units + 1` first segments of each unit.
    pub unit_segs: Vec<i32>,
    /// `tiles + 1` first segments of each tile (a tile's segments are consecutive).
    pub tile_segs: Vec<i32>,
}

/// Stream-K over `units` warps of the iteration space of `p` (`lean::TileSpace` with
/// [`TILE_K`]-token iterations and 16-row query groups), as segments the decode kernel walks.
pub fn schedule_tables(p: &AttentionProblem, units: usize) -> ScheduleTables {
    let qgroups = (p.group_size() * p.max_seqlen_q).div_ceil(ROWS);
    let space = TileSpace::new(p, TILE_K, qgroups);
    let schedule = Schedule::stream_k(&space, units.max(1));
    let segs = schedule.segments(&space);
    let units = schedule.num_ctas();
    let tiles = space.num_tiles();
    let mut seg_tab = Vec::with_capacity(segs.len() * 4);
    let mut unit_segs = vec![0i32; units + 1];
    let mut tile_segs = vec![-1i32; tiles + 1];
    for (i, s) in segs.iter().enumerate() {
        let (b, _, _) = space.tile_coords(s.tile);
        let sk = p.seqlens_k[b];
        let t0 = (s.local_begin as usize * TILE_K).min(sk);
        let t1 = (s.local_end as usize * TILE_K).min(sk);
        seg_tab.extend_from_slice(&[s.tile as i32, t0 as i32, t1 as i32, 0]);
        unit_segs[s.cta + 1] = i as i32 + 1;
        if tile_segs[s.tile] < 0 {
            tile_segs[s.tile] = i as i32;
        }
    }
    for u in 1..=units {
        unit_segs[u] = unit_segs[u].max(unit_segs[u - 1]);
    }
    tile_segs[tiles] = segs.len() as i32;
    ScheduleTables {
        qgroups,
        tiles,
        units,
        segs: seg_tab,
        unit_segs,
        tile_segs,
    }
}

/// Tokens per sequence a cache made for `capacity` tokens holds ([`TurboQuantCuda::alloc_cache`]
/// rounds up to whole 16-token decode iterations).
pub fn cache_capacity(capacity: usize) -> usize {
    capacity.div_ceil(TILE_K).max(1) * TILE_K
}

/// Device bytes [`TurboQuantCuda::alloc_cache`] allocates for `batch` sequences of `capacity`
/// tokens, `heads_kv` heads of dimension `d` (sign bytes are allocated with or without QJL),
/// codes as nibbles (the largest layout; [`cache_bytes_for`] follows the configuration's).
pub fn cache_bytes(batch: usize, heads_kv: usize, d: usize, capacity: usize) -> usize {
    cache_bytes_with(batch, heads_kv, d, capacity, (false, false))
}

/// [`cache_bytes`] for a configuration: key and value codes of at most 2 bits as crumbs.
pub fn cache_bytes_for(
    cfg: &ferrattn_core::turboquant::TurboQuantConfig,
    batch: usize,
    heads_kv: usize,
    d: usize,
    capacity: usize,
) -> usize {
    cache_bytes_with(batch, heads_kv, d, capacity, support::code_crumbs(cfg))
}

fn cache_bytes_with(
    batch: usize,
    heads_kv: usize,
    d: usize,
    capacity: usize,
    (kc, vc): (bool, bool),
) -> usize {
    let rows = batch * heads_kv * cache_capacity(capacity);
    [
        rows * layout::key_code_bytes(d, kc),
        rows * d / 8,
        rows * 4,
        rows / 2 * layout::value_pair_bytes(d, vc),
        rows * 2,
    ]
    .iter()
    .map(|b| b.div_ceil(4) * 4)
    .sum()
}

/// Dynamic shared memory of a decode CTA of `warps` warps: every warp's cp.async ring, then
/// every warp's query A fragments: `[2][d/16][32 lanes]` register quads of 16 bytes with 16 rows
/// (`rows16`, `decode_r16`); with at most 8 rows (`decode_r8`) the `S q` array is half that
/// (`[d/32][32 lanes]` quads, two chunks stacked on the MMA's rows 0-7 and 8-15: `qjl_word` in
/// turboquant_decode.cu): 54 KiB a 4-warp CTA at d = 128 instead of 62. With at most 8 rows the
/// query areas are the CTA's tile slots, each followed at the end by its 32 lanes' QJL row
/// constants (`cgs`, 4 bytes a lane: the tile's fragments are loaded once per CTA).
pub fn decode_smem_bytes(head_dim: usize, warps: usize, rows16: bool) -> usize {
    let quads = head_dim / 16 * 32; // one array of A fragments, in 16-byte quads
    let query = if rows16 { 2 * quads } else { quads + quads / 2 };
    let row_constants = if rows16 { 0 } else { 32 * 4 };
    warps * (DECODE_STAGES * DECODE_STAGE_BYTES + query * 16 + row_constants)
}

/// Most warps of the merge kernels (`turboquant_combine_w16_d*`), whose association the fused
/// merge keeps (`kMaxMergeWarps`).
pub const MAX_MERGE_WARPS: usize = 16;

/// Shared memory the merge fused into the decode (`fused_merge` in turboquant_decode.cu) reuses
/// once every warp of the CTA is past its loop: `Π` (f32, `d x d`), the sums of up to
/// [`MAX_MERGE_WARPS`] virtual merge warps for the 8 rows of an <= 8-row tile, `O_rot` of those
/// rows, the virtual warps' `l`, `M` and `l` per row and a flag (135,760 bytes at d = 128).
pub fn fused_merge_smem_bytes(head_dim: usize) -> usize {
    let d = head_dim;
    4 * (d * d + MAX_MERGE_WARPS * 8 * d + 8 * d + MAX_MERGE_WARPS * 8 + 8 + 8 + 4)
}

/// Dynamic shared memory of a decode CTA with the merge fused in (the `_r8f` kernels: CTAs of
/// [`MAX_UNIT_WARPS_R8`] warps, opt-in, [`TurboQuantCuda::fused_merge_for`]): its rings and
/// query fragments, the fused merge's ([`fused_merge_smem_bytes`]) and more than half of what
/// one CTA may have on the device (`opt_in`, the per-block opt-in maximum, which is the SM's
/// shared memory less the 1 KiB every CTA reserves), so that two such CTAs never fit one SM:
/// one CTA per SM by construction, whatever carveout the driver picks. The unfused 7-warp
/// launches take it only where two of them would fit by registers ([`seven_warp_smem_bytes`]).
pub fn small_work_smem_bytes(head_dim: usize, opt_in: usize) -> usize {
    let one_per_sm = (opt_in / 2 + 1).div_ceil(16) * 16;
    decode_smem_bytes(head_dim, MAX_UNIT_WARPS_R8, false)
        .max(fused_merge_smem_bytes(head_dim))
        .max(one_per_sm)
}

/// Dynamic shared memory of an unfused <= 8-row decode launch of `warps` warps per CTA:
/// [`decode_smem_bytes`], except 7-warp CTAs of a kernel of which two fit an SM by registers
/// and threads (`two_fit`, the occupancy at [`decode_smem_bytes`] queried at load), which take
/// [`small_work_smem_bytes`]: one CTA per SM whatever the carveout.
///
/// Why (issue-10-b1): registers are allocated per SM sub-partition (4 of 16,384 each), so at
/// <= 128 registers a sub-partition holds 4 warps and two 7-warp CTAs (4 + 4 + 3 + 3 warps)
/// fit one SM; above 128 it holds 3 and only one does (`cudaOccMaxBlocksPerSMRegsLimit`). At
/// d = 128 the `knc_vc` and `kn8_vc` kernels (k2-v2, k3-v2) have 128, every other 8-row kernel
/// 133 to 142. The small-work schedule ([`small_decode`]) gives each of 7 x SMs units the same
/// work and assumes one CTA per SM; where two fit, the driver's carveout lets them pair up on
/// some SMs (the decode's CTAs are placed while the prepare's still hold SMs under PDL) and
/// those SMs' warps run at about half speed: k2-v2 at batch 1 x 32k took 35.7 µs a step against
/// 27.1 for main's 133-register kernel (H200, issue-10-pack2), while `ncu` (kernels alone, one
/// CTA per SM on an idle GPU) timed the decode 1.3 µs faster. Padded (135,760 B at d = 128),
/// k2-v2 takes 25.7-25.8 µs and k3-v2 25.6-25.7 against 35.6-35.8 and 34.8-34.9 (H200,
/// issue-10-b1 call 1; 4-warp CTAs: 27.9 and 28.5). Kernels of which only one fits keep
/// [`decode_smem_bytes`]: padding them measured 0.2-0.5 µs slower a step at batch 1 (H200,
/// issue-10-decode7 calls 1 and 2).
pub fn seven_warp_smem_bytes(head_dim: usize, warps: usize, opt_in: usize, two_fit: bool) -> usize {
    if warps == MAX_UNIT_WARPS_R8 && two_fit {
        small_work_smem_bytes(head_dim, opt_in)
    } else {
        decode_smem_bytes(head_dim, warps, false)
    }
}

/// 16-token iterations of `p`'s decode (every output tile over its sequence's keys).
pub fn decode_iterations(p: &AttentionProblem) -> usize {
    let qgroups = (p.group_size() * p.max_seqlen_q).div_ceil(ROWS);
    p.seqlens_k
        .iter()
        .map(|&l| l.div_ceil(TILE_K))
        .sum::<usize>()
        * p.heads_kv
        * qgroups
}

/// Default stream-K width: every resident warp when there is work for each to run
/// [`MIN_UNIT_ITERS`] iterations, else fewer, in whole waves of one CTA (`warps` warps) per SM
/// (at least one CTA per SM).
pub fn default_units(p: &AttentionProblem, resident: usize, sms: usize, warps: usize) -> usize {
    let wave = warps * sms;
    let want = decode_iterations(p).div_ceil(MIN_UNIT_ITERS).div_ceil(wave) * wave;
    want.clamp(wave, resident.max(wave))
}

/// The merge's small-batch case, shared by [`row_split`] and [`merge_warps`]: fewer output
/// tiles than half the SMs.
fn small_batch(tiles: usize, sms: usize) -> bool {
    2 * tiles <= sms
}

/// Warps per merge CTA: 16 (`turboquant_combine_w16_d*`) when the merge runs one CTA per row in
/// use at small batch (`row_split > 1` with fewer tiles than half the SMs: a row's ~200 partials
/// at batch 1, 32k, are two batches of loads per warp instead of four), else 8
/// (`turboquant_combine_d*`: at batch 64, 4k the 16-warp merge took the step from 191 to 205 µs
/// on an H200 against the 8-warp one of the same build, issue-10-decode3 call 2; and two 8-warp
/// CTAs fit an SM where one 16-warp CTA does, so the split rows of [`row_split`]'s middle range
/// stay one wave). `forced` (`FERRATTN_TQ_MERGE_WARPS`) overrides.
pub fn merge_warps(row_split: usize, tiles: usize, sms: usize, forced: Option<usize>) -> usize {
    forced.unwrap_or(if row_split > 1 && small_batch(tiles, sms) {
        16
    } else {
        COMBINE_WARPS
    })
}

/// Merge CTAs per output tile: with fewer tiles than half the SMs (small batch), one CTA per
/// row in use (rows `r ≡ part mod row_split`); with up to one tile per SM (16 x 8 KV heads on
/// 132 SMs), two CTAs per tile of 8 warps each (rows of one parity; two such CTAs fit an SM by
/// registers, so `2 · tiles` CTAs are one wave), which halves the rows each CTA merges one after
/// the other (issue-10-decode19: the merge at 16 x 16k, 128 CTAs of 4 rows, took 10.9-11.7 µs on an
/// H200 under `ncu`, 24% issue active, stalled on its rows' L2 round trips; split, 10.0-10.1 µs,
/// and the step 2.1-2.6 µs shorter at 16 x 16k, d 128, every configuration); else one CTA per tile
/// (its rows share the reads of `Π`).
pub fn row_split(p: &AttentionProblem, tiles: usize, sms: usize) -> usize {
    let rows = (p.group_size() * p.max_seqlen_q).min(ROWS);
    if small_batch(tiles, sms) {
        rows.next_power_of_two()
    } else if tiles <= sms && rows > 1 {
        2
    } else {
        1
    }
}

/// Shared memory of a fast compression kernel (`tqf::compress_fast` in turboquant_compress.cu):
/// the `wgmma` B operands as 128-byte-swizzled `d x d` f16 matrices (`Π`, its split's low part,
/// and `S Πᵀ` for keys with QJL; 1024 bytes of slack align them to their 1024-byte swizzle
/// atoms) and the code lookup's tables.
pub fn fast_compress_smem_bytes(d: usize, keys_with_qjl: bool, split: bool) -> usize {
    let mat = d * d * 2;
    1024 + mat
        + if split { mat } else { 0 }
        + if keys_with_qjl { mat } else { 0 }
        + CODE_LUT_BINS
        + 4 * (16 + 32) // the code lookup: a count byte per bin, 16 boundaries, 32 centroids
}

/// `Π` as f16 hi and lo (`lo = f16(Π - hi)`) and `S Πᵀ` (f64 products, rounded once to f16),
/// as f16 bits, row-major: the A operands of the fast compression kernels.
pub fn fast_matrices(pi: &[f32], s: &[f32], d: usize) -> (Vec<u16>, Vec<u16>, Vec<u16>) {
    let hi: Vec<f16> = pi.iter().map(|&x| f16::from_f32(x)).collect();
    let lo: Vec<u16> = pi
        .iter()
        .zip(&hi)
        .map(|(&x, h)| f16::from_f32(x - h.to_f32()).to_bits())
        .collect();
    let mut m = vec![0u16; d * d];
    for i in 0..d {
        for k in 0..d {
            let v: f64 = (0..d)
                .map(|o| s[i * d + o] as f64 * pi[k * d + o] as f64)
                .sum();
            m[i * d + k] = f16::from_f64(v).to_bits();
        }
    }
    (hi.iter().map(|h| h.to_bits()).collect(), lo, m)
}

/// Shared memory of a compression kernel (`compress` in turboquant_compress.cu).
pub fn compress_smem_bytes(d: usize, keys_with_qjl: bool) -> usize {
    let s = d + 4;
    let mats = if keys_with_qjl { 2 } else { 1 };
    4 * (mats * d * s + 2 * COMPRESS_TOKENS * s + 2 * COMPRESS_TOKENS) + 2 * COMPRESS_TOKENS * d
}

#[cfg(test)]
mod tests;
