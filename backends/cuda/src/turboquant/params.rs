//! Kernel parameters: `#[repr(C)]` mirrors of the structs in `turboquant_*.cu`, and the
//! codebook tables that fill them.

use super::contract::FastDiv;
use half::f16;

// ---- kernel parameters (mirrors of the structs in the .cu files) --------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct CompressParams {
    pub(super) src: u64,
    pub(super) dst0: u64,
    pub(super) count: u64,
    pub(super) pi: u64,
    pub(super) s: u64,
    pub(super) codes: u64,
    pub(super) signs: u64,
    pub(super) norms: u64,
    pub(super) batch: i32,
    pub(super) src_len: i32,
    pub(super) heads_kv: i32,
    pub(super) cap: i32,
    pub(super) groups: i32,
    pub(super) n_bounds: i32,
    pub(super) bounds: [f32; 15],
    pub(super) cents: [f32; 16],
}

/// Mirror of `tqf::FastParams` (turboquant_compress.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct FastCompressParams {
    pub(super) src: u64,
    pub(super) dst0: u64,
    pub(super) count: u64,
    pub(super) pi_hi: u64,
    pub(super) pi_lo: u64,
    pub(super) m: u64,
    pub(super) lut: u64,
    pub(super) codes: u64,
    pub(super) signs: u64,
    pub(super) norms: u64,
    pub(super) batch: i32,
    pub(super) src_len: i32,
    pub(super) heads_kv: i32,
    pub(super) cap: i32,
    pub(super) groups: i32,
    pub(super) n_bounds: i32,
    pub(super) bounds: [f32; 15],
    pub(super) cents: [f32; 16],
    pub(super) lut_lo: f32,
    pub(super) lut_hi: f32,
    pub(super) lut_scale: f32,
    pub(super) lut_off: f32,
    /// `item / groups` as `umulhi(item, groups_div.0) >> groups_div.1` ([`FastDiv`]).
    pub(super) groups_div: FastDiv,
    /// `bh / heads_kv`, likewise.
    pub(super) heads_div: FastDiv,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct DecodeParams {
    pub(super) qf: u64,
    pub(super) qf_lo: u64,
    pub(super) pf: u64,
    pub(super) kcodes: u64,
    pub(super) ksigns: u64,
    pub(super) knorms: u64,
    pub(super) vcodes: u64,
    pub(super) vnorms: u64,
    pub(super) segs: u64,
    pub(super) unit_segs: u64,
    pub(super) part_o: u64,
    pub(super) part_ml: u64,
    pub(super) seqlens_q: u64,
    pub(super) seqlens_k: u64,
    pub(super) units: i32,
    pub(super) heads_kv: i32,
    pub(super) cap: i32,
    pub(super) qgroups: i32,
    pub(super) group: i32,
    pub(super) max_sq: i32,
    pub(super) causal: i32,
    /// Diagnostic switches: bit 0, the first segment's ring is issued after the wait on the
    /// prepare, not before (`FERRATTN_TQ_EARLY=0`); bit 1, the <= 8-row kernels load the query
    /// fragments per warp and segment instead of once per CTA and tile (`FERRATTN_TQ_SHARE_Q=0`);
    /// bit 2, they write their partials as scalar stores, not through the ring
    /// (`FERRATTN_TQ_RING_O=0`)
    pub(super) diag: i32,
    pub(super) ktab: [u32; 8],
    pub(super) vtab: [u32; 8],
    // read by the `_r8f` kernels only (the merge fused into the decode, `fused_merge`)
    pub(super) tile_segs: u64,
    /// `[tiles]` i32 segment counters in the workspace (zero between launches)
    pub(super) counts: u64,
    pub(super) pi: u64,
    pub(super) o: u64,
    pub(super) lse: u64,
    pub(super) heads_q: i32,
    /// Warps of the merge kernel whose association the fused merge keeps (8 or 16)
    pub(super) merge_warps: i32,
    pub(super) oscale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct PrepareParams {
    pub(super) q: u64,
    pub(super) pit: u64,
    pub(super) st: u64,
    pub(super) qf: u64,
    pub(super) qf_lo: u64,
    pub(super) pf: u64,
    pub(super) seqlens_q: u64,
    pub(super) heads_kv: i32,
    pub(super) group: i32,
    pub(super) max_sq: i32,
    pub(super) qgroups: i32,
    pub(super) heads_q: i32,
    pub(super) qjl: i32,
    pub(super) batch_tiles: i32,
    pub(super) qscale: f32,
    pub(super) pscale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct CombineParams {
    pub(super) part_o: u64,
    pub(super) part_ml: u64,
    pub(super) tile_segs: u64,
    pub(super) pi: u64,
    pub(super) o: u64,
    pub(super) lse: u64,
    pub(super) seqlens_q: u64,
    pub(super) heads_kv: i32,
    pub(super) group: i32,
    pub(super) max_sq: i32,
    pub(super) qgroups: i32,
    pub(super) heads_q: i32,
    pub(super) tiles: i32,
    pub(super) row_split: i32,
    pub(super) oscale: f32,
}

/// Byte tables of up to 16 f16 centroids: words 0-3 the low bytes, 4-7 the high bytes.
pub fn centroid_tables(cents: &[f32]) -> [u32; 8] {
    let mut t = [0u32; 8];
    for (i, &c) in cents.iter().enumerate().take(16) {
        let bits = f16::from_f32(c).to_bits();
        t[i / 4] |= ((bits & 0xff) as u32) << (8 * (i % 4));
        t[4 + i / 4] |= ((bits >> 8) as u32) << (8 * (i % 4));
    }
    t
}

/// A factor `σ` in `[1, 2)` for which the f16 roundings of `σ c_i` are smallest (largest
/// relative error over the nonzero centroids). The kernels hold `σ c` in f16 and divide `σ` out
/// in f32 (keys: in the query scale; values: in the merge), so a codebook's f16 rounding, a
/// systematic error shared by every coordinate with the same index, drops from up to 2^-11
/// relative to under 2^-13 for the 1-8 distinct magnitudes of these codebooks.
pub fn f16_friendly_scale(cents: &[f32]) -> f32 {
    let err = |sigma: f32| {
        cents
            .iter()
            .filter(|c| **c != 0.0)
            .map(|&c| {
                let x = sigma * c;
                ((f16::from_f32(x).to_f32() - x) / x).abs()
            })
            .fold(0.0f32, f32::max)
    };
    let steps = 1u32 << 18;
    let mut best = (err(1.0), 1.0f32);
    for i in 1..steps {
        let sigma = 1.0 + i as f32 / steps as f32;
        let e = err(sigma);
        if e < best.0 {
            best = (e, sigma);
        }
    }
    best.1
}

pub(super) fn codebook_arrays(
    cb: &ferrattn_core::turboquant::Codebook,
) -> (i32, [f32; 15], [f32; 16]) {
    let mut bounds = [0f32; 15];
    let mut cents = [0f32; 16];
    let b = cb.boundaries_f32();
    bounds[..b.len()].copy_from_slice(b);
    cents[..cb.centroids_f32().len()].copy_from_slice(cb.centroids_f32());
    (b.len() as i32, bounds, cents)
}
