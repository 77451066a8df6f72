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

use crate::device::{DeviceBuffer, Gpu};
use crate::error::{check, CudaError, Result};
use crate::kernels::{self, Function};
use crate::launch::{launch_on, DeviceOutputs};
use crate::CudaBackend;
use cudarc::driver::sys;
use ferrattn_core::lean::{Schedule, TileSpace};
use ferrattn_core::turboquant::{CompressedKv, TurboQuantCodec, TurboQuantConfig};
use ferrattn_core::{
    AttentionInputs, AttentionOutput, AttentionProblem, DType, KvLayout, Provenance,
};
use half::f16;
use std::sync::Arc;

/// MMA rows of one output tile (query heads of a KV group x query tokens).
pub const ROWS: usize = 16;
/// Tokens per decode iteration (one `n8` pair of `mma.m16n8k16`).
pub const TILE_K: usize = 16;
/// Warps (units) per CTA of the decode kernels: the 16-row ones (`decode_r16`, `kUnitWarps16`)
/// always, the <= 8-row ones (`decode_r8`) except at small work ([`small_decode`]). Those take
/// 4 to [`MAX_UNIT_WARPS_R8`] warps (`FERRATTN_TQ_UNIT_WARPS` forces one, a diagnostic): at
/// d = 128, 4-warp CTAs fit 3 per SM (12 warps). 7-warp CTAs at 128 registers, two per SM,
/// measured slower at every shape (H200, issue-10-decode4 call 1).
pub const UNIT_WARPS: usize = 4;
/// Most warps per CTA of the <= 8-row decode kernels (`kMaxUnitWarps8`), and their CTA size at
/// small work: one 7-warp CTA per SM ([`small_decode`]).
pub const MAX_UNIT_WARPS_R8: usize = 7;

/// Whether `p`'s decode (at most 8 MMA rows in use) takes the small-work schedule on `sms` SMs:
/// one CTA of [`MAX_UNIT_WARPS_R8`] warps per SM, so 7 units per SM instead of every resident
/// warp (12 per SM at d = 128), each running ~1.7x the iterations. Chosen where the default
/// width would give every warp 8 to 16 iterations (batch 1 at 32k with 8 KV heads: 10.3): there
/// it measured 34.5 µs against 39.0 µs a step (1 x 32k, k4q-v3, H200, issue-10-decode4 call 2,
/// as `FERRATTN_TQ_UNIT_WARPS=7`, the same kernels), at 16 x 16k and 32 x 32k (83 and 248
/// iterations a warp) 7% and 11% slower. Fewer than 8 a warp (shorter contexts) was not measured
/// and keeps the default.
pub fn small_decode(p: &AttentionProblem, sms: usize) -> bool {
    const DEFAULT_WARPS_PER_SM: usize = 12; // 3 CTAs of UNIT_WARPS at d = 128
    if p.group_size() * p.max_seqlen_q > 8 {
        return false;
    }
    let per_warp = decode_iterations(p) as f64 / (DEFAULT_WARPS_PER_SM * sms) as f64;
    (8.0..16.0).contains(&per_warp)
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
/// Stages of the fast compression kernels' cp.async ring (`tqf::kStages`).
pub const FAST_STAGES: usize = 3;

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

fn l2(x: &[f32]) -> f32 {
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

/// Entry points of one configuration (the closed list of `turboquant_*.cu`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelNames {
    /// Keys: `TurboQuant_prod` (QJL) or `TurboQuant_mse`.
    pub compress_keys: String,
    /// Values: `TurboQuant_mse`.
    pub compress_values: String,
    /// `Π q`, `S q` into A fragments.
    pub prepare_q: String,
    /// Fused decode with rows 8-15 of the MMA unused.
    pub decode_r8: String,
    /// Fused decode with all 16 MMA rows.
    pub decode_r16: String,
    /// Merge of the partials and `Πᵀ`, 8 warps a CTA.
    pub combine: String,
    /// The same merge, 16 warps a CTA (small batch, [`merge_warps`]).
    pub combine_w16: String,
    /// Keys on tensor cores, one f16 `Π` ([`CompressPath::Fast`]).
    pub fast_keys: String,
    /// Values on tensor cores, one f16 `Π`.
    pub fast_values: String,
    /// Keys on tensor cores, `Π` split hi + lo ([`CompressPath::Split`]).
    pub split_keys: String,
    /// Values on tensor cores, `Π` split hi + lo.
    pub split_values: String,
}

/// Checks a configuration against the closed list of the kernels.
pub fn check_supported(cfg: &TurboQuantConfig, p: &AttentionProblem) -> Result<()> {
    let unsupported = |what: String, supported: &str| CudaError::Unsupported {
        what,
        supported: supported.into(),
    };
    if p.dtype != DType::F16 {
        return Err(unsupported(
            format!("TurboQuant on CUDA with {} inputs", p.dtype),
            "f16",
        ));
    }
    if p.kv_layout != KvLayout::Separate {
        return Err(unsupported(
            "TurboQuant on CUDA over an MLA latent cache".into(),
            "separate K and V",
        ));
    }
    let d = p.head_dim_qk;
    if p.head_dim_v != d || !matches!(d, 64 | 128) {
        return Err(unsupported(
            format!(
                "TurboQuant on CUDA with head dims qk = {d}, v = {}",
                p.head_dim_v
            ),
            "qk = v = 64 or 128",
        ));
    }
    if !(2..=4).contains(&cfg.key_bits) || !(2..=4).contains(&cfg.value_bits) {
        return Err(unsupported(
            format!(
                "TurboQuant on CUDA with {} key bits and {} value bits",
                cfg.key_bits, cfg.value_bits
            ),
            "2, 3 or 4 bits for keys (QJL bit included) and values",
        ));
    }
    if cfg.key_qjl && cfg.qjl_dim != d {
        return Err(unsupported(
            format!(
                "TurboQuant on CUDA with qjl_dim = {} at d = {d}",
                cfg.qjl_dim
            ),
            "qjl_dim = head dim (the paper's m = d)",
        ));
    }
    Ok(())
}

/// Kernel names for a configuration; `Unsupported` outside the closed list.
pub fn kernel_names(cfg: &TurboQuantConfig, p: &AttentionProblem) -> Result<KernelNames> {
    check_supported(cfg, p)?;
    let d = p.head_dim_qk;
    let k = match (cfg.key_qjl, cfg.key_codebook_bits()) {
        (true, 1..=3) => "kqjl",
        (false, 2..=3) => "kn8",
        (false, 4) => "kn16",
        (qjl, b) => {
            return Err(CudaError::Unsupported {
                what: format!("key codebook of {b} bits (QJL {qjl})"),
                supported: "1-3 bits with QJL, 2-4 without".into(),
            })
        }
    };
    let v = if cfg.value_bits == 4 { "v16" } else { "v8" };
    Ok(KernelNames {
        compress_keys: format!(
            "turboquant_compress_keys_{}_d{d}",
            if cfg.key_qjl { "qjl" } else { "mse" }
        ),
        compress_values: format!("turboquant_compress_values_d{d}"),
        fast_keys: format!(
            "turboquant_fast_keys_{}_d{d}",
            if cfg.key_qjl { "qjl" } else { "mse" }
        ),
        fast_values: format!("turboquant_fast_values_d{d}"),
        split_keys: format!(
            "turboquant_split_keys_{}_d{d}",
            if cfg.key_qjl { "qjl" } else { "mse" }
        ),
        split_values: format!("turboquant_split_values_d{d}"),
        prepare_q: format!("turboquant_prepare_q_d{d}"),
        decode_r8: format!("turboquant_decode_d{d}_{k}_{v}_r8"),
        decode_r16: format!("turboquant_decode_d{d}_{k}_{v}_r16"),
        combine: format!("turboquant_combine_d{d}"),
        combine_w16: format!("turboquant_combine_w16_d{d}"),
    })
}

/// The device layout of the compressed cache and its host twin (what the kernels write and read;
/// see the header of `cuda-kernels/turboquant_compress.cu`).
pub mod layout {
    /// First channel of key code byte `beta` of a token row (the second is the next channel):
    /// lane block `q = beta / (d/8)` holds the channels of lane `4g + q`'s B fragments.
    pub fn key_byte_channel(d: usize, beta: usize) -> usize {
        let (q, bl) = (beta / (d / 8), beta % (d / 8));
        16 * (bl / 2) + 8 * (bl % 2) + 2 * q
    }

    /// Channel of sign bit `bit` (0 .. d) of a token row's sign bytes.
    pub fn sign_bit_channel(d: usize, bit: usize) -> usize {
        let per_lane = d / 4; // bits per lane block
        let (q, b) = (bit / per_lane, bit % per_lane);
        let (jj, e) = (b % (d / 8), b / (d / 8));
        16 * (jj / 2) + 8 * (jj % 2) + 2 * q + e
    }

    /// Channel of value code byte `beta` of a token pair (both tokens' nibbles share it).
    pub fn value_byte_channel(d: usize, beta: usize) -> usize {
        let (g, nu) = (beta / (d / 8), beta % (d / 8));
        8 * nu + g
    }

    /// One key row (`d` indices) as its `d / 2` device bytes.
    pub fn pack_key_codes(idx: &[u8]) -> Vec<u8> {
        let d = idx.len();
        (0..d / 2)
            .map(|beta| {
                let c = key_byte_channel(d, beta);
                idx[c] | (idx[c + 1] << 4)
            })
            .collect()
    }

    /// The core's packed signs (bit `i % 8` of byte `i / 8` is channel `i`) as device bytes.
    pub fn pack_signs(d: usize, signs: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; d / 8];
        for bit in 0..d {
            let c = sign_bit_channel(d, bit);
            // lane block of d/32 bytes, little-endian word
            if signs[c / 8] >> (c % 8) & 1 == 1 {
                out[bit / 8] |= 1 << (bit % 8);
            }
        }
        out
    }

    /// Inverse of [`pack_signs`].
    pub fn unpack_signs(d: usize, dev: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; d / 8];
        for bit in 0..d {
            if dev[bit / 8] >> (bit % 8) & 1 == 1 {
                let c = sign_bit_channel(d, bit);
                out[c / 8] |= 1 << (c % 8);
            }
        }
        out
    }

    /// Inverse of [`pack_key_codes`].
    pub fn unpack_key_codes(dev: &[u8]) -> Vec<u8> {
        let d = dev.len() * 2;
        let mut idx = vec![0u8; d];
        for (beta, &byte) in dev.iter().enumerate() {
            let c = key_byte_channel(d, beta);
            idx[c] = byte & 15;
            idx[c + 1] = byte >> 4;
        }
        idx
    }

    /// Token `e` (0: even, 1: odd) of a value pair record (`d` bytes) as `d` indices.
    pub fn unpack_value_codes(rec: &[u8], e: usize) -> Vec<u8> {
        let d = rec.len();
        let mut idx = vec![0u8; d];
        for (beta, &byte) in rec.iter().enumerate() {
            idx[value_byte_channel(d, beta)] = (byte >> (4 * e)) & 15;
        }
        idx
    }
}

// ---- kernel parameters (mirrors of the structs in the .cu files) --------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CompressParams {
    src: u64,
    dst0: u64,
    count: u64,
    pi: u64,
    s: u64,
    codes: u64,
    signs: u64,
    norms: u64,
    batch: i32,
    src_len: i32,
    heads_kv: i32,
    cap: i32,
    groups: i32,
    n_bounds: i32,
    bounds: [f32; 15],
    cents: [f32; 16],
}

/// Mirror of `tqf::FastParams` (turboquant_compress.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FastCompressParams {
    src: u64,
    dst0: u64,
    count: u64,
    pi_hi: u64,
    pi_lo: u64,
    m: u64,
    lut: u64,
    codes: u64,
    signs: u64,
    norms: u64,
    batch: i32,
    src_len: i32,
    heads_kv: i32,
    cap: i32,
    groups: i32,
    n_bounds: i32,
    bounds: [f32; 15],
    cents: [f32; 16],
    lut_lo: f32,
    lut_hi: f32,
    lut_scale: f32,
    lut_off: f32,
    /// `item / groups` as `umulhi(item, groups_div.0) >> groups_div.1` ([`FastDiv`]).
    groups_div: FastDiv,
    /// `bh / heads_kv`, likewise.
    heads_div: FastDiv,
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
        let v = y.mul_add(self.scale, self.off);
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

    /// `(#{boundaries < y}, its centroid)` as the kernel looks them up.
    pub fn code(&self, y: f32) -> (u8, f32) {
        let e = self.entries[self.bin(y)];
        // as the kernel: the sign bit of bound - y (equal values give +0)
        let up = (e[0] - y).to_bits() >> 31 == 1;
        let c = e[1].to_bits() + up as u32;
        (c as u8, if up { e[3] } else { e[2] })
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct DecodeParams {
    qf: u64,
    qf_lo: u64,
    pf: u64,
    kcodes: u64,
    ksigns: u64,
    knorms: u64,
    vcodes: u64,
    vnorms: u64,
    segs: u64,
    unit_segs: u64,
    part_o: u64,
    part_ml: u64,
    seqlens_q: u64,
    seqlens_k: u64,
    units: i32,
    heads_kv: i32,
    cap: i32,
    qgroups: i32,
    group: i32,
    max_sq: i32,
    causal: i32,
    /// 1: the first segment's ring is issued after the wait on the prepare, not before
    /// (`FERRATTN_TQ_EARLY=0`, a diagnostic switch)
    late_ring: i32,
    ktab: [u32; 8],
    vtab: [u32; 8],
}

/// The prepare kernel of a step (`Π q` and `S q` into the decode's A fragments): both compute
/// every output element with the same FMAs in the same order, so their outputs are
/// bit-identical; they differ in how the work is spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepareKernel {
    /// `Spread` up to [`PREPARE_SPREAD_MAX_TILES`] output tiles, `V1` above.
    Auto,
    /// `turboquant_prepare_q_v1_d*`: one CTA per (tile, 32 output columns), each thread both
    /// matrices and up to 16 rows (D / 32 CTAs per tile).
    V1,
    /// `turboquant_prepare_q_d*` (issue 10's prepare pass): one CTA per (tile, 8 output
    /// columns), each thread one matrix and up to 8 rows (D / 8 CTAs per tile).
    Spread,
}

/// [`PrepareKernel::Auto`] launches the spread prepare up to this many output tiles (128 CTAs at
/// D = 128, one per SM on an H100 / H200), v1 above. Measured on an H200 (2026-11-26,
/// docs/TURBOQUANT_CUDA.md "the prepare kernel"): spread 2.1 µs a step faster at 8 tiles (batch
/// 1, 8 KV heads), 7% and 25% a step slower at 128 and 512 tiles (16 x 16k, 64 x 4k). Nothing
/// between 8 and 128 tiles was measured, so the bound is the measured win's.
pub const PREPARE_SPREAD_MAX_TILES: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PrepareParams {
    q: u64,
    pit: u64,
    st: u64,
    qf: u64,
    qf_lo: u64,
    pf: u64,
    seqlens_q: u64,
    heads_kv: i32,
    group: i32,
    max_sq: i32,
    qgroups: i32,
    heads_q: i32,
    qjl: i32,
    batch_tiles: i32,
    qscale: f32,
    pscale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct CombineParams {
    part_o: u64,
    part_ml: u64,
    tile_segs: u64,
    pi: u64,
    o: u64,
    lse: u64,
    seqlens_q: u64,
    heads_kv: i32,
    group: i32,
    max_sq: i32,
    qgroups: i32,
    heads_q: i32,
    tiles: i32,
    row_split: i32,
    oscale: f32,
}

fn arg<T>(x: &mut T) -> *mut std::ffi::c_void {
    x as *mut T as *mut std::ffi::c_void
}

/// [`launch_on`] (plain, not cooperative) or, with `programmatic`, with programmatic stream
/// serialization: the kernel may be scheduled once every CTA of the kernel before it on `stream`
/// has started and signalled (`griddepcontrol.launch_dependents`: first thing in the decode and
/// the merge, right after its own wait in the query preparation), and waits on the device
/// (`griddepcontrol.wait`) before reading that kernel's output. Inside a stream capture the
/// driver records a programmatic graph edge.
///
/// # Safety
/// As [`launch_on`]; `f` calls `griddepcontrol.wait` before its first read of anything the
/// kernel before it on `stream` writes, and writes nothing that kernel reads.
unsafe fn launch_step_kernel(
    gpu: &Arc<Gpu>,
    f: &Function,
    (grid, block): (u32, u32),
    smem: u32,
    stream: sys::CUstream,
    programmatic: bool,
    args: &mut [*mut std::ffi::c_void],
) -> Result<()> {
    if !programmatic {
        // SAFETY: forwarded from this function's contract.
        return unsafe { launch_on(gpu, f, (grid, block), smem, stream, false, args) };
    }
    let _bound = gpu.bind()?;
    // Raw cuLaunchKernelEx: cudarc's safe layer has no launch attributes.
    // SAFETY: an all-zero launch attribute is a valid value of the C union (IGNORE), then
    // filled as the driver documents it.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: grid,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: smem,
        hStream: stream,
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: `cfg` and `attr` outlive the call; args as in this function's contract.
    check("cuLaunchKernelEx", unsafe {
        sys::cuLaunchKernelEx(&cfg, f.f, args.as_mut_ptr(), std::ptr::null_mut())
    })
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

fn codebook_arrays(cb: &ferrattn_core::turboquant::Codebook) -> (i32, [f32; 15], [f32; 16]) {
    let mut bounds = [0f32; 15];
    let mut cents = [0f32; 16];
    let b = cb.boundaries_f32();
    bounds[..b.len()].copy_from_slice(b);
    cents[..cb.centroids_f32().len()].copy_from_slice(cb.centroids_f32());
    (b.len() as i32, bounds, cents)
}

fn set_smem(f: &Function, bytes: usize) -> Result<()> {
    let _bound = f.bind()?;
    // SAFETY: valid function handle; the size is within the device's opt-in limit (checked by
    // the launch, which fails with a driver error otherwise).
    check("cuFuncSetAttribute", unsafe {
        sys::cuFuncSetAttribute(
            f.f,
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )
    })
}

fn occupancy(f: &Function, threads: usize, smem: usize) -> Result<usize> {
    let _bound = f.bind()?;
    let mut occ = 0i32;
    // SAFETY: out-parameter query on a valid function.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut occ, f.f, threads as i32, smem)
    })?;
    Ok(occ.max(1) as usize)
}

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

/// The compressed cache on the device, contiguous per (sequence, KV head), `capacity` tokens.
#[derive(Debug)]
pub struct DeviceTurboQuantCache {
    batch: usize,
    heads_kv: usize,
    head_dim: usize,
    capacity: usize,
    key_qjl: bool,
    lens: Vec<usize>,
    kcodes: DeviceBuffer,
    ksigns: DeviceBuffer,
    knorms: DeviceBuffer,
    vcodes: DeviceBuffer,
    vnorms: DeviceBuffer,
}

impl DeviceTurboQuantCache {
    /// Address of the key (`keys`) or value codes, as the compression kernels write them.
    fn codes_of(&self, keys: bool) -> u64 {
        if keys {
            self.kcodes.ptr()
        } else {
            self.vcodes.ptr()
        }
    }

    /// Address of the key (`keys`) or value norms, as the compression kernels write them.
    fn norms_of(&self, keys: bool) -> u64 {
        if keys {
            self.knorms.ptr()
        } else {
            self.vnorms.ptr()
        }
    }

    /// Tokens held per sequence.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Tokens each sequence can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes a decode step reads for the valid tokens (K codes, signs with QJL, norms, V codes
    /// and norms).
    pub fn bytes_read(&self) -> usize {
        self.lens.iter().sum::<usize>() * self.heads_kv * self.bytes_per_token_head()
    }

    /// Device bytes a decode reads per token and KV head: `d/2 + 4` for keys (`+ d/8` of signs
    /// with QJL), `d/2 + 2` for values (one nibble per coordinate whatever the bit width).
    pub fn bytes_per_token_head(&self) -> usize {
        let d = self.head_dim;
        d / 2 + if self.key_qjl { d / 8 } else { 0 } + 4 + d / 2 + 2
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// KV heads.
    pub fn heads_kv(&self) -> usize {
        self.heads_kv
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Whether keys carry QJL signs and residual norms.
    pub fn key_qjl(&self) -> bool {
        self.key_qjl
    }

    /// Device bytes allocated for the cache (its capacity, every buffer).
    pub fn allocated_bytes(&self) -> usize {
        [
            &self.kcodes,
            &self.ksigns,
            &self.knorms,
            &self.vcodes,
            &self.vnorms,
        ]
        .iter()
        .map(|b| b.bytes())
        .sum()
    }

    /// Forgets every token (lengths to 0); the bytes stay until overwritten by the next append.
    pub fn clear(&mut self) {
        self.lens.iter_mut().for_each(|l| *l = 0);
    }

    /// `‖k‖` of the first token of every (sequence, KV head), as f32 (a cheap look at a cache
    /// written on the device, without downloading it all).
    pub fn first_key_norms(&self) -> Result<Vec<f32>> {
        let kn: Vec<u32> = self.knorms.to_vec()?;
        Ok((0..self.batch * self.heads_kv)
            .map(|bh| f16::from_bits(kn[bh * self.capacity] as u16).to_f32())
            .collect())
    }

    /// Copies the cache back as the core's [`CompressedKv`] over `max_seqlen_k` padded tokens
    /// (rows past each sequence's length are zero, as [`TurboQuantCodec::compress`] leaves them).
    pub fn download(&self, max_seqlen_k: usize) -> Result<CompressedKv> {
        let (b_, hk, d, cap) = (self.batch, self.heads_kv, self.head_dim, self.capacity);
        let kc: Vec<u8> = self.kcodes.to_vec()?;
        let ks: Vec<u8> = self.ksigns.to_vec()?;
        let kn: Vec<u32> = self.knorms.to_vec()?;
        let vc: Vec<u8> = self.vcodes.to_vec()?;
        let vn: Vec<u16> = self.vnorms.to_vec()?;
        let rows = b_ * max_seqlen_k * hk;
        let mut kv = CompressedKv {
            batch: b_,
            max_seqlen_k,
            heads_kv: hk,
            head_dim_k: d,
            head_dim_v: d,
            qjl_dim: d,
            seqlens_k: self.lens.clone(),
            k_idx: vec![0; rows * d],
            k_norm: vec![0.0; rows],
            k_signs: vec![0; rows * d / 8],
            r_norm: vec![0.0; rows],
            v_idx: vec![0; rows * d],
            v_norm: vec![0.0; rows],
        };
        let h2f = |b: u16| f16::from_bits(b).to_f32();
        for b in 0..b_ {
            for j in 0..self.lens[b].min(max_seqlen_k) {
                for h in 0..hk {
                    let src = (b * hk + h) * cap + j;
                    let dst = (b * max_seqlen_k + j) * hk + h;
                    kv.k_idx[dst * d..(dst + 1) * d].copy_from_slice(&layout::unpack_key_codes(
                        &kc[src * d / 2..(src + 1) * d / 2],
                    ));
                    kv.k_signs[dst * d / 8..(dst + 1) * d / 8].copy_from_slice(
                        &layout::unpack_signs(d, &ks[src * d / 8..(src + 1) * d / 8]),
                    );
                    kv.k_norm[dst] = h2f(kn[src] as u16);
                    kv.r_norm[dst] = h2f((kn[src] >> 16) as u16);
                    let pair = ((b * hk + h) * cap) / 2 + j / 2;
                    kv.v_idx[dst * d..(dst + 1) * d].copy_from_slice(&layout::unpack_value_codes(
                        &vc[pair * d..(pair + 1) * d],
                        j % 2,
                    ));
                    kv.v_norm[dst] = h2f(vn[src]);
                }
            }
        }
        Ok(kv)
    }
}

/// Alignment of every region of a TurboQuant step's workspace, bytes.
pub const TURBOQUANT_WORKSPACE_ALIGN: usize = 256;

fn ws_align(x: usize) -> usize {
    x.div_ceil(TURBOQUANT_WORKSPACE_ALIGN) * TURBOQUANT_WORKSPACE_ALIGN
}

/// Appends `words` to `image` at an aligned offset and returns the offset.
fn push_table(image: &mut Vec<u8>, words: &[i32]) -> usize {
    let at = ws_align(image.len());
    image.resize(at, 0);
    image.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    at
}

fn i32s(x: &[usize]) -> Vec<i32> {
    x.iter().map(|&l| l as i32).collect()
}

/// The decode half of a step, planned on the host ([`TurboQuantCuda::decode_tables`]): the
/// stream-K schedule of `problem` over `units` warps as the kernels' tables, and the sizes of
/// the scratch its launches write (the query fragments, the partials).
#[derive(Clone, Debug, PartialEq)]
pub struct TurboQuantDecodeTables {
    /// The problem (queries, and the caches' lengths when the decode runs as `seqlens_k`).
    pub problem: AttentionProblem,
    /// Units (warps) of the stream-K schedule.
    pub units: usize,
    /// Output tiles (sequence, KV head, 16-row query group).
    pub tiles: usize,
    /// Segments (partials) the units write.
    pub segments: usize,
    /// Merge CTAs per output tile (each takes every `row_split`-th row).
    pub row_split: usize,
    qgroups: usize,
    /// 16 MMA rows in use (`decode_r16`) rather than at most 8 (`decode_r8`).
    r16: bool,
    head_dim: usize,
    key_qjl: bool,
    segs: Vec<i32>,
    unit_segs: Vec<i32>,
    tile_segs: Vec<i32>,
}

impl TurboQuantDecodeTables {
    /// The decode of `p`'s queries under `cfg` over caches that will hold `p.seqlens_k` tokens
    /// when it runs, stream-K over `units` warps on a GPU of `compute_units` SMs (pure host;
    /// [`TurboQuantCuda::default_units`] is the usual width).
    pub fn new(
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
        units: usize,
        compute_units: usize,
    ) -> Result<TurboQuantDecodeTables> {
        check_supported(cfg, p)?;
        if units == 0 || compute_units == 0 {
            return Err(CudaError::Plan(format!(
                "a stream-K decode over {units} units (warps) on {compute_units} SMs; both must \
                 be positive"
            )));
        }
        let ScheduleTables {
            qgroups,
            tiles,
            units,
            segs,
            unit_segs,
            tile_segs,
        } = schedule_tables(p, units);
        Ok(TurboQuantDecodeTables {
            problem: p.clone(),
            units,
            tiles,
            segments: segs.len() / 4,
            row_split: row_split(p, tiles, compute_units),
            qgroups,
            r16: p.group_size() * p.max_seqlen_q > 8,
            head_dim: p.head_dim_qk,
            key_qjl: cfg.key_qjl,
            segs,
            unit_segs,
            tile_segs,
        })
    }

    /// Bytes of the query fragments `Π q` (hi and lo halves) and `S q`: one register quad per
    /// lane, `d/16` k-steps, per tile.
    fn frag_bytes(&self) -> usize {
        self.tiles * 32 * self.head_dim * 2
    }
}

/// The append half of a step, planned on the host ([`TurboQuantAppendTables::new`]): where
/// each sequence's new tokens go.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboQuantAppendTables {
    before: Vec<usize>,
    after: Vec<usize>,
    src_len: usize,
    /// 16-token destination groups per (sequence, KV head) of the widest sequence.
    groups: usize,
}

impl TurboQuantAppendTables {
    /// The append of `counts[b]` tokens (of `src_len` per sequence in the source) onto caches
    /// holding `lens_before[b]` tokens of at most `capacity` (pure host).
    pub fn new(
        lens_before: &[usize],
        counts: &[usize],
        src_len: usize,
        capacity: usize,
    ) -> Result<TurboQuantAppendTables> {
        let b_ = lens_before.len();
        if counts.len() != b_ {
            return Err(CudaError::Plan(format!(
                "{} token counts for a cache of {b_} sequences",
                counts.len()
            )));
        }
        for (b, (&c, &l)) in counts.iter().zip(lens_before).enumerate() {
            if c > src_len || l.saturating_add(c) > capacity {
                return Err(CudaError::Plan(format!(
                    "sequence {b}: {c} new tokens (source holds {src_len}) onto {l} cached exceed the capacity of {capacity}"
                )));
            }
        }
        let groups = counts
            .iter()
            .zip(lens_before)
            .map(|(&c, &l)| (l % COMPRESS_TOKENS + c).div_ceil(COMPRESS_TOKENS))
            .max()
            .unwrap_or(0);
        Ok(TurboQuantAppendTables {
            before: lens_before.to_vec(),
            after: lens_before.iter().zip(counts).map(|(l, c)| l + c).collect(),
            src_len,
            groups,
        })
    }

    /// Tokens per sequence before the append.
    pub fn lens_before(&self) -> &[usize] {
        &self.before
    }
    /// Tokens per sequence after it.
    pub fn lens_after(&self) -> &[usize] {
        &self.after
    }
    /// Tokens per sequence of the source tensors.
    pub fn src_len(&self) -> usize {
        self.src_len
    }
}

/// Offsets of the decode's regions in a step's workspace.
#[derive(Clone, Copy, Debug, PartialEq)]
struct DecodeRegions {
    segs: usize,
    unit_segs: usize,
    tile_segs: usize,
    seqlens_q: usize,
    seqlens_k: usize,
    qf: usize,
    qf_lo: usize,
    pf: usize,
    part_o: usize,
    part_ml: usize,
}

/// Offsets of the append's regions in a step's workspace.
#[derive(Clone, Copy, Debug, PartialEq)]
struct AppendRegions {
    dst0: usize,
    count: usize,
}

/// One TurboQuant step planned on the host: an append, a decode or both, laid out in one
/// workspace. Its tables are one image at the workspace's start, copied by one stream-ordered
/// copy ([`TurboQuantCuda::upload_step`]); after them come the decode's scratch regions (query
/// fragments, partials), which every layer's launches reuse in stream order. Every region is
/// [`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned.
#[derive(Clone, Debug, PartialEq)]
pub struct TurboQuantStepPlan {
    decode: Option<TurboQuantDecodeTables>,
    append: Option<TurboQuantAppendTables>,
    image: Vec<u8>,
    dec: Option<DecodeRegions>,
    app: Option<AppendRegions>,
    bytes: usize,
}

impl TurboQuantStepPlan {
    /// Lays out a step's tables and scratch (host only).
    pub fn new(
        decode: Option<TurboQuantDecodeTables>,
        append: Option<TurboQuantAppendTables>,
    ) -> TurboQuantStepPlan {
        let mut image = Vec::new();
        let app = append.as_ref().map(|a| AppendRegions {
            dst0: push_table(&mut image, &i32s(&a.before)),
            count: push_table(
                &mut image,
                &a.after
                    .iter()
                    .zip(&a.before)
                    .map(|(&x, &b)| (x - b) as i32)
                    .collect::<Vec<_>>(),
            ),
        });
        let mut bytes = ws_align(image.len());
        let dec = decode.as_ref().map(|t| {
            let p = &t.problem;
            let segs = push_table(&mut image, &t.segs);
            let unit_segs = push_table(&mut image, &t.unit_segs);
            let tile_segs = push_table(&mut image, &t.tile_segs);
            let seqlens_q = push_table(&mut image, &i32s(&p.seqlens_q));
            let seqlens_k = push_table(&mut image, &i32s(&p.seqlens_k));
            let mut at = ws_align(image.len());
            let mut region = |n: usize| {
                let r = at;
                at = ws_align(at + n);
                r
            };
            let frag = t.frag_bytes();
            let r = DecodeRegions {
                segs,
                unit_segs,
                tile_segs,
                seqlens_q,
                seqlens_k,
                qf: region(frag),
                qf_lo: region(frag),
                // without QJL the kernels take the address and never read it
                pf: region(if t.key_qjl { frag } else { 4 }),
                part_o: region(t.segments * ROWS * t.head_dim * 4),
                part_ml: region(t.segments * ROWS * 2 * 4),
            };
            bytes = at;
            r
        });
        TurboQuantStepPlan {
            decode,
            append,
            image,
            dec,
            app,
            bytes,
        }
    }

    /// Workspace bytes of the step: its tables, then the decode's scratch.
    pub fn workspace_bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the tables [`TurboQuantCuda::upload_step`] copies (the workspace's start).
    pub fn table_bytes(&self) -> usize {
        self.image.len()
    }

    /// The decode half, if the step decodes.
    pub fn decode(&self) -> Option<&TurboQuantDecodeTables> {
        self.decode.as_ref()
    }

    /// The append half, if the step appends.
    pub fn append(&self) -> Option<&TurboQuantAppendTables> {
        self.append.as_ref()
    }
}

/// A decode made ready to launch: the addresses of its tables and scratch on the device (in a
/// caller's workspace, [`TurboQuantCuda::upload_step`], or in memory it owns,
/// [`TurboQuantCuda::prepare_decode`]).
#[derive(Debug)]
pub struct PreparedTurboQuantDecode {
    /// The problem (queries, and the cache's lengths as `seqlens_k`).
    pub problem: AttentionProblem,
    /// Units (warps) of the stream-K schedule.
    pub units: usize,
    /// Output tiles (sequence, KV head, 16-row query group).
    pub tiles: usize,
    /// Segments (partials) the units write.
    pub segments: usize,
    /// Merge CTAs per output tile (each takes every `row_split`-th row).
    pub row_split: usize,
    qgroups: usize,
    decode: Function,
    /// Warps per CTA of the decode launch ([`UNIT_WARPS`]).
    warps: usize,
    segs: u64,
    unit_segs: u64,
    tile_segs: u64,
    qf: u64,
    qf_lo: u64,
    pf: u64,
    part_o: u64,
    part_ml: u64,
    seqlens_q: u64,
    seqlens_k: u64,
    /// The memory the addresses point into, when the prepared decode owns it.
    _owned: Option<Arc<DeviceBuffer>>,
}

impl PreparedTurboQuantDecode {
    /// Warps per CTA of the decode launch ([`UNIT_WARPS`], or [`MAX_UNIT_WARPS_R8`] at small
    /// work: [`TurboQuantCuda::unit_warps_for`]).
    pub fn warps_per_cta(&self) -> usize {
        self.warps
    }
}

/// An append made ready to launch: where each sequence's new tokens go, on the device (in a
/// caller's workspace, [`TurboQuantCuda::upload_step`], or in memory it owns,
/// [`TurboQuantCuda::prepare_append`]).
#[derive(Debug)]
pub struct PreparedTurboQuantAppend {
    tables: TurboQuantAppendTables,
    dst0: u64,
    count: u64,
    /// The memory the addresses point into, when the prepared append owns it.
    _owned: Option<Arc<DeviceBuffer>>,
}

impl PreparedTurboQuantAppend {
    /// Tokens per sequence before the append.
    pub fn lens_before(&self) -> &[usize] {
        &self.tables.before
    }
    /// Tokens per sequence after it.
    pub fn lens_after(&self) -> &[usize] {
        &self.tables.after
    }
    /// Tokens per sequence of the source tensors.
    pub fn src_len(&self) -> usize {
        self.tables.src_len
    }
}

/// A step's prepared launches over one workspace ([`TurboQuantCuda::upload_step`]).
#[derive(Debug)]
pub struct PreparedTurboQuantStep {
    /// The decode, if the step decodes.
    pub decode: Option<PreparedTurboQuantDecode>,
    /// The append, if the step appends.
    pub append: Option<PreparedTurboQuantAppend>,
}

/// The TurboQuant kernels of one layer configuration, with `Π`, `S` and the codebooks on the
/// device.
#[derive(Debug)]
pub struct TurboQuantCuda {
    gpu: Arc<Gpu>,
    /// The configuration.
    pub cfg: TurboQuantConfig,
    /// The CPU codec of the same configuration (the contract).
    pub codec: TurboQuantCodec,
    head_dim: usize,
    poison: bool,
    provenance: Provenance,
    names: KernelNames,
    compress_keys: Function,
    compress_values: Function,
    fast_keys: Function,
    fast_values: Function,
    split_keys: Function,
    split_values: Function,
    path: CompressPath,
    prepare_q: Function,
    /// The prepare kernel before issue 10's prepare pass (`turboquant_prepare_q_v1_d*`: D / 32
    /// CTAs per tile instead of D / 8, bit-identical outputs); see [`PrepareKernel`].
    prepare_q_v1: Function,
    /// Which of the two prepare kernels steps launch.
    prepare_kernel: PrepareKernel,
    decode_r8: Function,
    decode_r16: Function,
    /// The merge kernels of 8 and 16 warps a CTA (see [`merge_warps`]).
    combine: Function,
    combine_w16: Function,
    /// `FERRATTN_TQ_MERGE_WARPS` (8 or 16): every step's merge with that many warps.
    merge_forced: Option<usize>,
    pi: DeviceBuffer,
    pit: DeviceBuffer,
    s: DeviceBuffer,
    st: DeviceBuffer,
    /// f16 bits of `Π` (hi), `Π - hi` (lo) and `S Πᵀ`, row-major, for the fast kernels.
    pi_hi: DeviceBuffer,
    pi_lo: DeviceBuffer,
    m_hi: DeviceBuffer,
    /// Code lookups of the fast kernels (keys, values) and their device copies.
    key_lut: (CodeLut, DeviceBuffer),
    value_lut: (CodeLut, DeviceBuffer),
    key_cb: (i32, [f32; 15], [f32; 16]),
    value_cb: (i32, [f32; 15], [f32; 16]),
    ktab: [u32; 8],
    vtab: [u32; 8],
    /// Scale of the key table ([`f16_friendly_scale`]), divided out of the query scale.
    sigma_k: f32,
    /// Scale of the value table, divided out in the merge.
    sigma_v: f32,
    smem_keys: usize,
    smem_values: usize,
    smem_fast_keys: usize,
    smem_fast_values: usize,
    /// Resident CTAs per SM of the fast and the split kernels (keys, values), queried at load.
    fast_per_sm: [[usize; 2]; 2],
    /// Warps of the decode kernels (`decode_r8`, `decode_r16`) resident on the whole GPU
    /// (queried once, at load: planning a step makes no driver call).
    resident: [usize; 2],
    /// Resident CTAs per SM of the key and the value compression kernels.
    compress_per_sm: [usize; 2],
    /// The decode and the merge are launched with programmatic stream serialization
    /// ([`launch_programmatic`]; compute capability 9.0 or newer).
    programmatic: bool,
    /// The decode issues its first segment's ring after its wait on the prepare
    /// (`FERRATTN_TQ_EARLY=0`; by default before it, see turboquant_decode.cu).
    late_ring: bool,
    /// The prepare is launched with programmatic serialization too (with `programmatic`; after
    /// the kernel before it, whichever it is). `FERRATTN_TQ_PREPARE_PDL=0`: plain stream order.
    prepare_pdl: bool,
    /// `FERRATTN_TQ_UNIT_WARPS` (4 to [`MAX_UNIT_WARPS_R8`]): the CTA size of every 8-row
    /// decode, whatever its size (see [`Self::unit_warps_for`]).
    unit_warps_forced: Option<usize>,
    /// A 7-warp CTA's shared memory fits this device (opt-in maximum per block): the
    /// small-work schedule is available ([`small_decode`]; 111 KiB at d = 128, so not on GPUs
    /// with about 100 KiB).
    seven_fit: bool,
}

fn transpose(m: &[f32], d: usize) -> Vec<f32> {
    let mut t = vec![0f32; d * d];
    for i in 0..d {
        for j in 0..d {
            t[j * d + i] = m[i * d + j];
        }
    }
    t
}

/// Tokens per sequence a cache made for `capacity` tokens holds ([`TurboQuantCuda::alloc_cache`]
/// rounds up to whole 16-token decode iterations).
pub fn cache_capacity(capacity: usize) -> usize {
    capacity.div_ceil(TILE_K).max(1) * TILE_K
}

/// Device bytes [`TurboQuantCuda::alloc_cache`] allocates for `batch` sequences of `capacity`
/// tokens, `heads_kv` heads of dimension `d` (sign bytes are allocated with or without QJL).
pub fn cache_bytes(batch: usize, heads_kv: usize, d: usize, capacity: usize) -> usize {
    let rows = batch * heads_kv * cache_capacity(capacity);
    [rows * d / 2, rows * d / 8, rows * 4, rows * d / 2, rows * 2]
        .iter()
        .map(|b| b.div_ceil(4) * 4)
        .sum()
}

/// Dynamic shared memory of a decode CTA of `warps` warps: every warp's cp.async ring, then
/// every warp's query A fragments (`[2][d/16][32 lanes]` register quads of 16 bytes).
pub fn decode_smem_bytes(head_dim: usize, warps: usize) -> usize {
    warps * (DECODE_STAGES * DECODE_STAGE_BYTES + 2 * (head_dim / 16) * 32 * 16)
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

/// Warps per merge CTA: 16 (`turboquant_combine_w16_d*`) when the merge runs one CTA per row in
/// use (`row_split > 1`, small batch: a row's ~200 partials at batch 1, 32k, are two batches of
/// loads per warp instead of four), else 8 (`turboquant_combine_d*`: at batch 64, 4k the 16-warp
/// merge took the step from 191 to 205 µs on an H200 against the 8-warp one of the same build,
/// issue-10-decode3 call 2). `forced` (`FERRATTN_TQ_MERGE_WARPS`) overrides.
pub fn merge_warps(row_split: usize, forced: Option<usize>) -> usize {
    forced.unwrap_or(if row_split > 1 { 16 } else { COMBINE_WARPS })
}

/// Merge CTAs per output tile: with fewer tiles than half the SMs (small batch), one CTA per
/// row in use (rows `r ≡ part mod row_split`), else one CTA per tile (its rows share the reads
/// of `Π`).
pub fn row_split(p: &AttentionProblem, tiles: usize, sms: usize) -> usize {
    if 2 * tiles > sms {
        return 1;
    }
    (p.group_size() * p.max_seqlen_q)
        .min(ROWS)
        .next_power_of_two()
}

/// Shared memory of a fast compression kernel (`tqf::compress_fast` in turboquant_compress.cu):
/// the cp.async ring, the residual tile (keys with QJL), norms, `γ` partials, the codebook, the
/// sign words, the destination rows (a ring of 4 chunks) and the code rows (`d/2 + 16` bytes each: byte stores of
/// different rows fall in different banks).
pub fn fast_compress_smem_bytes(d: usize, keys_with_qjl: bool) -> usize {
    let tile = FAST_ROWS * (d + 8) * 2;
    let warps = d / 16;
    FAST_STAGES * tile
        + if keys_with_qjl { tile } else { 0 }
        + 4 * (2 * FAST_ROWS + warps * FAST_ROWS + 32)
        + FAST_ROWS * 16
        + 4 * FAST_ROWS * 8 // the destination-row ring (tqf::kDstSlots)
        + FAST_ROWS * (d / 2 + 16)
        + CODE_LUT_BINS * 16
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

impl TurboQuantCuda {
    /// Loads the kernels of `cfg` for problems shaped like `p` (head dim, dtype) on `backend`.
    pub fn new(
        backend: &CudaBackend,
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
    ) -> Result<TurboQuantCuda> {
        let names = kernel_names(cfg, p)?;
        let gpu = backend.gpu()?.clone();
        let caps_smem = gpu.caps.shared_mem_per_block;
        let force = backend.options().force_nvrtc;
        let load = |img: &str| {
            kernels::Module::load(
                &gpu,
                kernels::image(img).expect("turboquant images are embedded by build.rs"),
                force,
            )
        };
        let cm = load("turboquant_compress")?;
        let dm = load("turboquant_decode")?;
        // FERRATTN_TQ_MERGE_WARPS=8 or 16: one merge for every step (a diagnostic switch, so that
        // one build is timed and tested both ways; see merge_warps)
        let merge_forced = match std::env::var("FERRATTN_TQ_MERGE_WARPS").as_deref() {
            Ok("8") => Some(8),
            Ok("16") => Some(16),
            _ => None,
        };
        let d = p.head_dim_qk;
        let codec = TurboQuantCodec::new(cfg, d, d);
        let pi_h = codec.key_rotation().matrix().to_vec();
        let s_h = codec.sketch().matrix().to_vec();
        let key_cb = codebook_arrays(codec.key.mse().codebook());
        let value_cb = codebook_arrays(codec.value.codebook());
        let kc = codec.key.mse().codebook().centroids_f32();
        let vc = codec.value.codebook().centroids_f32();
        let (sigma_k, sigma_v) = (f16_friendly_scale(kc), f16_friendly_scale(vc));
        let ktab = centroid_tables(&kc.iter().map(|c| c * sigma_k).collect::<Vec<_>>());
        let vtab = centroid_tables(&vc.iter().map(|c| c * sigma_v).collect::<Vec<_>>());
        let (pi_hi, pi_lo, m_hi) = fast_matrices(&pi_h, &s_h, d);
        let lut_of = |cb: &ferrattn_core::turboquant::Codebook| -> Result<(CodeLut, DeviceBuffer)> {
            let l = CodeLut::new(cb.boundaries_f32(), cb.centroids_f32());
            let buf = DeviceBuffer::from_slice(&gpu, &l.entries)?;
            Ok((l, buf))
        };
        let key_lut = lut_of(codec.key.mse().codebook())?;
        let value_lut = lut_of(codec.value.codebook())?;
        let mut t = TurboQuantCuda {
            compress_keys: cm.function(&names.compress_keys)?,
            compress_values: cm.function(&names.compress_values)?,
            fast_keys: cm.function(&names.fast_keys)?,
            fast_values: cm.function(&names.fast_values)?,
            split_keys: cm.function(&names.split_keys)?,
            split_values: cm.function(&names.split_values)?,
            path: CompressPath::Exact,
            key_lut,
            value_lut,
            pi_hi: DeviceBuffer::from_slice(&gpu, &pi_hi)?,
            pi_lo: DeviceBuffer::from_slice(&gpu, &pi_lo)?,
            m_hi: DeviceBuffer::from_slice(&gpu, &m_hi)?,
            smem_fast_keys: fast_compress_smem_bytes(d, cfg.key_qjl),
            smem_fast_values: fast_compress_smem_bytes(d, false),
            prepare_q: dm.function(&names.prepare_q)?,
            prepare_q_v1: dm.function(&format!("turboquant_prepare_q_v1_d{d}"))?,
            // FERRATTN_TQ_PREPARE=v1 / spread: one prepare kernel at every batch (diagnostic:
            // one build timed both ways; the outputs are bit-identical)
            prepare_kernel: match std::env::var("FERRATTN_TQ_PREPARE").as_deref() {
                Ok("v1") => PrepareKernel::V1,
                Ok("spread") => PrepareKernel::Spread,
                _ => PrepareKernel::Auto,
            },
            decode_r8: dm.function(&names.decode_r8)?,
            decode_r16: dm.function(&names.decode_r16)?,
            combine: dm.function(&names.combine)?,
            combine_w16: dm.function(&names.combine_w16)?,
            merge_forced,
            pi: DeviceBuffer::from_slice(&gpu, &pi_h)?,
            pit: DeviceBuffer::from_slice(&gpu, &transpose(&pi_h, d))?,
            s: DeviceBuffer::from_slice(&gpu, &s_h)?,
            st: DeviceBuffer::from_slice(&gpu, &transpose(&s_h, d))?,
            smem_keys: compress_smem_bytes(d, cfg.key_qjl),
            smem_values: compress_smem_bytes(d, false),
            gpu,
            cfg: cfg.clone(),
            codec,
            head_dim: d,
            poison: backend.options().poison_outputs,
            provenance: Provenance {
                backend: "cuda".into(),
                device: backend.gpu()?.caps.name.clone(),
                simulated: None,
            },
            names,
            key_cb,
            value_cb,
            ktab,
            vtab,
            sigma_k,
            sigma_v,
            resident: [0; 2],
            compress_per_sm: [0; 2],
            fast_per_sm: [[0; 2]; 2],
            programmatic: false,
            // FERRATTN_TQ_EARLY=0: the decode's first ring fill after its wait (diagnostic, as
            // FERRATTN_TQ_PDL: one build timed and tested both ways)
            late_ring: std::env::var("FERRATTN_TQ_EARLY").is_ok_and(|v| v == "0"),
            // FERRATTN_TQ_PREPARE_PDL=0: the prepare in plain stream order (diagnostic, as above)
            prepare_pdl: std::env::var("FERRATTN_TQ_PREPARE_PDL").map_or(true, |v| v != "0"),
            // FERRATTN_TQ_UNIT_WARPS=4..7: the 8-row decode's CTA size (diagnostic, as above)
            unit_warps_forced: std::env::var("FERRATTN_TQ_UNIT_WARPS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&w| {
                    (UNIT_WARPS..=MAX_UNIT_WARPS_R8).contains(&w)
                        && decode_smem_bytes(d, w) <= caps_smem
                }),
            seven_fit: decode_smem_bytes(d, MAX_UNIT_WARPS_R8) <= caps_smem,
        };
        // FERRATTN_TQ_PDL=0: plain stream order (a diagnostic switch, so that one build can be
        // tested both ways on a GPU)
        t.set_programmatic_launch(std::env::var("FERRATTN_TQ_PDL").map_or(true, |v| v != "0"));
        set_smem(&t.compress_keys, t.smem_keys)?;
        set_smem(&t.compress_values, t.smem_values)?;
        for f in [&t.fast_keys, &t.split_keys] {
            set_smem(f, t.smem_fast_keys)?;
        }
        for f in [&t.fast_values, &t.split_values] {
            set_smem(f, t.smem_fast_values)?;
        }
        // the 8-row kernels are launched with 4 to 7 warps per CTA (unit_warps_for)
        let most = if t.seven_fit {
            MAX_UNIT_WARPS_R8
        } else {
            t.unit_warps_forced.unwrap_or(UNIT_WARPS)
        };
        set_smem(&t.decode_r8, decode_smem_bytes(d, most))?;
        set_smem(&t.decode_r16, decode_smem_bytes(d, UNIT_WARPS))?;
        let sms = t.gpu.caps.compute_units;
        let warps = |f: &Function, w: usize| -> Result<usize> {
            Ok(occupancy(f, w * 32, decode_smem_bytes(d, w))? * w * sms)
        };
        t.resident = [
            warps(&t.decode_r8, t.unit_warps_forced.unwrap_or(UNIT_WARPS))?,
            warps(&t.decode_r16, UNIT_WARPS)?,
        ];
        t.compress_per_sm = [
            occupancy(&t.compress_keys, d, t.smem_keys)?,
            occupancy(&t.compress_values, d, t.smem_values)?,
        ];
        t.fast_per_sm = [
            [
                occupancy(&t.fast_keys, 2 * d, t.smem_fast_keys)?,
                occupancy(&t.fast_values, 2 * d, t.smem_fast_values)?,
            ],
            [
                occupancy(&t.split_keys, 2 * d, t.smem_fast_keys)?,
                occupancy(&t.split_values, 2 * d, t.smem_fast_values)?,
            ],
        ];
        Ok(t)
    }

    /// The same kernels compressing by `path`: every append enqueued from now on (prepared
    /// appends carry only where tokens go, not which kernels write them).
    pub fn with_compress_path(mut self, path: CompressPath) -> TurboQuantCuda {
        self.path = path;
        self
    }

    /// Selects the compression kernels of the appends enqueued from now on.
    pub fn set_compress_path(&mut self, path: CompressPath) {
        self.path = path;
    }

    /// The compression kernels appends use.
    pub fn compress_path(&self) -> CompressPath {
        self.path
    }

    /// Whether the decode and the merge of a step are launched with programmatic stream
    /// serialization (programmatic dependent launch: each may start while the kernel before it
    /// runs and waits for it on the device before reading its output). On by default where the
    /// GPU has it (compute capability 9.0+) unless the environment sets `FERRATTN_TQ_PDL=0`;
    /// `false` gives plain stream order (same results).
    pub fn set_programmatic_launch(&mut self, on: bool) {
        self.programmatic = on
            && self
                .gpu
                .caps
                .compute_capability
                .is_some_and(|cc| cc >= (9, 0));
    }

    /// Picks the prepare kernel of the steps launched from now on (default
    /// [`PrepareKernel::Auto`], or `FERRATTN_TQ_PREPARE=v1` / `spread` in the environment).
    /// Both kernels write bit-identical query fragments; a diagnostic switch and the reference of
    /// the bit-identity test.
    pub fn set_prepare_kernel(&mut self, k: PrepareKernel) {
        self.prepare_kernel = k;
    }

    /// Forces the warps per CTA of the 8-row decode launches prepared from now on (4 to
    /// [`MAX_UNIT_WARPS_R8`], where that CTA's shared memory fits; `None`: the default,
    /// [`Self::unit_warps_for`]), as `FERRATTN_TQ_UNIT_WARPS` does. The schedule (units,
    /// segments) does not depend on it, so with the same `units` the outputs are bit-identical
    /// (tested). The default width ([`Self::default_units`]) keeps the occupancy measured at
    /// load.
    pub fn set_unit_warps(&mut self, warps: Option<usize>) -> Result<()> {
        if let Some(w) = warps {
            let top = if self.seven_fit {
                MAX_UNIT_WARPS_R8
            } else {
                UNIT_WARPS
            };
            if !(UNIT_WARPS..=top).contains(&w) {
                return Err(CudaError::Unsupported {
                    what: format!("{w} warps per decode CTA"),
                    supported: format!("{UNIT_WARPS} to {top} on this device"),
                });
            }
        }
        self.unit_warps_forced = warps;
        Ok(())
    }

    /// See [`Self::set_programmatic_launch`].
    pub fn programmatic_launch(&self) -> bool {
        self.programmatic
    }

    /// The kernel names in use.
    pub fn names(&self) -> &KernelNames {
        &self.names
    }

    /// The GPU the kernels and their tables live on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// An empty cache for `batch` sequences of up to `capacity` tokens (rounded up to 16).
    /// Its buffers are zeroed on the backend's stream: synchronise it before work on another
    /// stream reads the cache.
    pub fn alloc_cache(
        &self,
        batch: usize,
        heads_kv: usize,
        capacity: usize,
    ) -> Result<DeviceTurboQuantCache> {
        let d = self.head_dim;
        let cap = cache_capacity(capacity);
        let rows = batch * heads_kv * cap;
        let zeroed = |bytes: usize| -> Result<DeviceBuffer> {
            let mut b = DeviceBuffer::alloc(&self.gpu, bytes.div_ceil(4) * 4)?;
            // padding tokens are read (and masked) by the last tile of a sequence: keep them finite
            b.fill_u32(0)?;
            Ok(b)
        };
        Ok(DeviceTurboQuantCache {
            batch,
            heads_kv,
            head_dim: d,
            capacity: cap,
            key_qjl: self.cfg.key_qjl,
            lens: vec![0; batch],
            kcodes: zeroed(rows * d / 2)?,
            ksigns: zeroed(rows * d / 8)?,
            knorms: zeroed(rows * 4)?,
            vcodes: zeroed(rows * d / 2)?,
            vnorms: zeroed(rows * 2)?,
        })
    }

    /// Compresses `counts[b]` tokens of f16 `k`, `v` (`[batch, src_len, heads_kv, d]` on the
    /// device) into the cache at each sequence's end, on the backend's stream. Allocates the
    /// append's two small tables ([`Self::prepare_append`]) and waits for the launches (the
    /// tables are freed on return); [`Self::enqueue_append`] is the launch-only form.
    pub fn append(
        &self,
        cache: &mut DeviceTurboQuantCache,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        src_len: usize,
        counts: &[usize],
    ) -> Result<()> {
        let (b_, hk, d) = (cache.batch, cache.heads_kv, self.head_dim);
        let need = b_ * src_len * hk * d * 2;
        if k.bytes() < need || v.bytes() < need {
            return Err(CudaError::Plan(format!(
                "k/v buffers of {} / {} bytes, {need} needed for [{b_}, {src_len}, {hk}, {d}] f16",
                k.bytes(),
                v.bytes()
            )));
        }
        let prep = self.prepare_append(&cache.lens, counts, src_len, cache.capacity)?;
        // SAFETY: k and v are live buffers of this GPU holding [batch, src_len, heads_kv, d]
        // f16 (checked above); the backend's own stream.
        unsafe { self.enqueue_append(&prep, cache, k.ptr(), v.ptr(), self.gpu.stream)? };
        // the tables are freed on return: the launches must be done with them
        self.gpu.synchronize()
    }

    /// [`TurboQuantAppendTables::new`] made ready in memory of its own: allocated and copied to the
    /// device here, synchronously (the convenience path: [`Self::append`], tests); the device
    /// path puts the same tables into a caller's workspace ([`Self::upload_step`]).
    pub fn prepare_append(
        &self,
        lens_before: &[usize],
        counts: &[usize],
        src_len: usize,
        capacity: usize,
    ) -> Result<PreparedTurboQuantAppend> {
        let t = TurboQuantAppendTables::new(lens_before, counts, src_len, capacity)?;
        let plan = TurboQuantStepPlan::new(None, Some(t));
        let step = self.prepare_owned(&plan)?;
        Ok(step.append.expect("the plan appends"))
    }

    /// A step's tables in a buffer of its own, copied synchronously (the convenience paths).
    fn prepare_owned(&self, plan: &TurboQuantStepPlan) -> Result<PreparedTurboQuantStep> {
        let buf = DeviceBuffer::alloc(&self.gpu, plan.workspace_bytes())?;
        // SAFETY: a fresh allocation of the plan's bytes on this GPU (cuMemAlloc aligns to at
        // least 256 bytes), used by nothing else; the backend's own stream, synchronised
        // before the tables are read on any other stream.
        let mut step = unsafe { self.upload_step(plan, buf.ptr(), self.gpu.stream)? };
        self.gpu.synchronize()?;
        let buf = Arc::new(buf);
        if let Some(d) = &mut step.decode {
            d._owned = Some(buf.clone());
        }
        if let Some(a) = &mut step.append {
            a._owned = Some(buf);
        }
        Ok(step)
    }

    /// Enqueues the copy of a step's tables into `workspace` on `stream` (one stream-ordered
    /// host-to-device copy, no allocation, no synchronisation; once per step, outside a graph
    /// capture) and returns the step's launches bound to the workspace's regions, for
    /// [`Self::enqueue_append`] and [`Self::enqueue_decode`] on `stream` (or a stream ordered
    /// after it). The copy reads `plan`'s host image; a pageable source is staged by the driver
    /// before the call returns.
    ///
    /// # Safety
    /// `workspace` is device memory of this GPU, [`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned,
    /// of at least `plan.workspace_bytes()` bytes, used by nothing else while the step's
    /// launches (and replays of graphs captured from them) run; `stream` is null or a live
    /// stream of this GPU's context.
    pub unsafe fn upload_step(
        &self,
        plan: &TurboQuantStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<PreparedTurboQuantStep> {
        if workspace == 0 || !workspace.is_multiple_of(TURBOQUANT_WORKSPACE_ALIGN as u64) {
            return Err(CudaError::Plan(format!(
                "a TurboQuant workspace must be non-null and {TURBOQUANT_WORKSPACE_ALIGN}-byte \
                 aligned (got {workspace:#x})"
            )));
        }
        let decode = match (&plan.decode, &plan.dec) {
            (Some(t), Some(r)) => {
                if (t.head_dim, t.key_qjl) != (self.head_dim, self.cfg.key_qjl) {
                    return Err(CudaError::Plan(format!(
                        "a decode of head dim {} (QJL {}) on kernels of head dim {} (QJL {})",
                        t.head_dim, t.key_qjl, self.head_dim, self.cfg.key_qjl
                    )));
                }
                let at = |off: usize| workspace + off as u64;
                Some(PreparedTurboQuantDecode {
                    problem: t.problem.clone(),
                    units: t.units,
                    tiles: t.tiles,
                    segments: t.segments,
                    row_split: t.row_split,
                    qgroups: t.qgroups,
                    decode: if t.r16 {
                        self.decode_r16.clone()
                    } else {
                        self.decode_r8.clone()
                    },
                    warps: self.unit_warps_for(&t.problem),
                    segs: at(r.segs),
                    unit_segs: at(r.unit_segs),
                    tile_segs: at(r.tile_segs),
                    qf: at(r.qf),
                    qf_lo: at(r.qf_lo),
                    pf: at(r.pf),
                    part_o: at(r.part_o),
                    part_ml: at(r.part_ml),
                    seqlens_q: at(r.seqlens_q),
                    seqlens_k: at(r.seqlens_k),
                    _owned: None,
                })
            }
            _ => None,
        };
        let append = match (&plan.append, &plan.app) {
            (Some(t), Some(r)) => Some(PreparedTurboQuantAppend {
                tables: t.clone(),
                dst0: workspace + r.dst0 as u64,
                count: workspace + r.count as u64,
                _owned: None,
            }),
            _ => None,
        };
        if !plan.image.is_empty() {
            let _bound = self.gpu.bind()?;
            // SAFETY: the caller vouched for `workspace` (this GPU's memory of at least the
            // plan's bytes, which cover the image) and the stream; the image is host memory
            // read before the call returns (a pageable source is staged by the driver).
            check("cuMemcpyHtoDAsync_v2", unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    workspace,
                    plan.image.as_ptr() as *const std::ffi::c_void,
                    plan.image.len(),
                    stream,
                )
            })?;
        }
        Ok(PreparedTurboQuantStep { decode, append })
    }

    /// Enqueues the compression of an append prepared by [`Self::prepare_append`] into
    /// `cache` on `stream`: launches only (no allocation, no synchronisation). The cache must
    /// hold the append's lengths before it, or after it (the same append enqueued again, e.g.
    /// an eager run and then its graph capture: the same slots are rewritten); it then holds
    /// the lengths after it.
    ///
    /// # Safety
    /// `k` and `v` are 16-byte aligned device addresses of this GPU holding f16 `[batch,
    /// src_len, heads_kv, d]` of `prep` and the cache; `stream` is a stream of this GPU's
    /// context (or null); the memory `prep`'s tables are in (its own, or the workspace of
    /// [`Self::upload_step`], whose copy is ordered before this launch) outlives the launches.
    pub unsafe fn enqueue_append(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &mut DeviceTurboQuantCache,
        k: u64,
        v: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.enqueue_append_by(prep, cache, k, v, self.path, stream) }
    }

    /// [`Self::enqueue_append`] through the compression kernels of `path` instead of the
    /// engine's [`Self::compress_path`]: for callers that share one engine between caches
    /// compressed by different paths (the device API's `TurboQuantCache` carries its own).
    ///
    /// # Safety
    /// As [`Self::enqueue_append`].
    pub unsafe fn enqueue_append_by(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &mut DeviceTurboQuantCache,
        k: u64,
        v: u64,
        path: CompressPath,
        stream: sys::CUstream,
    ) -> Result<()> {
        let d = self.head_dim;
        if cache.head_dim != d || cache.key_qjl != self.cfg.key_qjl {
            return Err(CudaError::Plan(format!(
                "a cache of head dim {} (QJL {}) on kernels of head dim {d} (QJL {})",
                cache.head_dim, cache.key_qjl, self.cfg.key_qjl
            )));
        }
        let t = &prep.tables;
        if cache.lens != t.before && cache.lens != t.after {
            return Err(CudaError::Plan(format!(
                "the append was prepared for lengths {:?} but the cache holds {:?}",
                t.before, cache.lens
            )));
        }
        if let Some(b) = t.after.iter().position(|&l| l > cache.capacity) {
            return Err(CudaError::Plan(format!(
                "sequence {b} would hold {} tokens; the cache holds {}",
                t.after[b], cache.capacity
            )));
        }
        if t.groups == 0 {
            cache.lens.clone_from(&t.after);
            return Ok(());
        }
        for (keys, src) in [(true, k), (false, v)] {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.launch_part(prep, cache, src, keys, path, stream)? };
        }
        cache.lens.clone_from(&t.after);
        Ok(())
    }

    /// One of the two launches of [`Self::enqueue_append`] (`keys`: the key kernel reading
    /// `src`, else the value kernel), leaving the cache's lengths as they are: for timing each
    /// compression kernel alone (benches, profilers). Checks as [`Self::enqueue_append`].
    ///
    /// # Safety
    /// As [`Self::enqueue_append`], for `src` in the place of `k` or `v`.
    pub unsafe fn enqueue_compress_part(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &DeviceTurboQuantCache,
        src: u64,
        keys: bool,
        stream: sys::CUstream,
    ) -> Result<()> {
        if cache.head_dim != self.head_dim || cache.key_qjl != self.cfg.key_qjl {
            return Err(CudaError::Plan(format!(
                "a cache of head dim {} (QJL {}) on kernels of head dim {} (QJL {})",
                cache.head_dim, cache.key_qjl, self.head_dim, self.cfg.key_qjl
            )));
        }
        if cache.lens.len() != prep.tables.before.len()
            || prep.tables.after.iter().any(|&l| l > cache.capacity)
        {
            return Err(CudaError::Plan(format!(
                "an append to lengths {:?} on a cache of {} sequences of {} tokens",
                prep.tables.after,
                cache.lens.len(),
                cache.capacity
            )));
        }
        if prep.tables.groups == 0 {
            return Ok(());
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.launch_part(prep, cache, src, keys, self.path, stream) }
    }

    /// The key or the value launch of an append (checks done by the callers).
    ///
    /// # Safety
    /// As [`Self::enqueue_append`].
    unsafe fn launch_part(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &DeviceTurboQuantCache,
        src: u64,
        keys: bool,
        path: CompressPath,
        stream: sys::CUstream,
    ) -> Result<()> {
        if path != CompressPath::Exact {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.launch_fast(prep, cache, src, keys, path, stream) };
        }
        let (b_, hk, d) = (cache.batch, cache.heads_kv, self.head_dim);
        let items = b_ * hk * prep.tables.groups;
        let sms = self.gpu.caps.compute_units;
        let (f, smem, cb, per_sm) = if keys {
            (
                &self.compress_keys,
                self.smem_keys,
                self.key_cb,
                self.compress_per_sm[0],
            )
        } else {
            (
                &self.compress_values,
                self.smem_values,
                self.value_cb,
                self.compress_per_sm[1],
            )
        };
        let mut prm = CompressParams {
            src,
            dst0: prep.dst0,
            count: prep.count,
            pi: self.pi.ptr(),
            s: self.s.ptr(),
            codes: cache.codes_of(keys),
            signs: cache.ksigns.ptr(),
            norms: cache.norms_of(keys),
            batch: b_ as i32,
            src_len: prep.tables.src_len as i32,
            heads_kv: hk as i32,
            cap: cache.capacity as i32,
            groups: prep.tables.groups as i32,
            n_bounds: cb.0,
            bounds: cb.1,
            cents: cb.2,
        };
        let grid = items.min(sms * per_sm) as u32;
        // SAFETY: the parameters match the kernel's; addresses vouched for by the caller
        // (k, v, stream) or owned by `prep`, the cache and `self`.
        unsafe {
            launch_on(
                &self.gpu,
                f,
                (grid, d as u32),
                smem as u32,
                stream,
                false,
                &mut [arg(&mut prm)],
            )?;
        }
        Ok(())
    }

    /// The fast kernel's launch of [`Self::launch_part`].
    ///
    /// # Safety
    /// As [`Self::enqueue_append`].
    unsafe fn launch_fast(
        &self,
        prep: &PreparedTurboQuantAppend,
        cache: &DeviceTurboQuantCache,
        src: u64,
        keys: bool,
        path: CompressPath,
        stream: sys::CUstream,
    ) -> Result<()> {
        let (b_, hk, d) = (cache.batch, cache.heads_kv, self.head_dim);
        // the tables count 16-token groups aligned to 16; twice as many 8-token tiles from the
        // 8-aligned start cover the same tokens (tiles past a sequence's tokens write nothing)
        let groups = 2 * prep.tables.groups;
        let chunks = (b_ * hk * groups).div_ceil(FAST_ROWS / FAST_TILE);
        let sms = self.gpu.caps.compute_units;
        let split = path == CompressPath::Split;
        let per = self.fast_per_sm[split as usize];
        let lut = if keys { &self.key_lut } else { &self.value_lut };
        let (f, smem, cb, per_sm) = match (keys, split) {
            (true, false) => (&self.fast_keys, self.smem_fast_keys, self.key_cb, per[0]),
            (true, true) => (&self.split_keys, self.smem_fast_keys, self.key_cb, per[0]),
            (false, false) => (
                &self.fast_values,
                self.smem_fast_values,
                self.value_cb,
                per[1],
            ),
            (false, true) => (
                &self.split_values,
                self.smem_fast_values,
                self.value_cb,
                per[1],
            ),
        };
        let mut prm = FastCompressParams {
            src,
            dst0: prep.dst0,
            count: prep.count,
            pi_hi: self.pi_hi.ptr(),
            pi_lo: self.pi_lo.ptr(),
            m: self.m_hi.ptr(),
            lut: lut.1.ptr(),
            codes: cache.codes_of(keys),
            signs: cache.ksigns.ptr(),
            norms: cache.norms_of(keys),
            batch: b_ as i32,
            src_len: prep.tables.src_len as i32,
            heads_kv: hk as i32,
            cap: cache.capacity as i32,
            groups: groups as i32,
            n_bounds: cb.0,
            bounds: cb.1,
            cents: cb.2,
            lut_lo: lut.0.lo,
            lut_hi: lut.0.hi,
            lut_scale: lut.0.scale,
            lut_off: lut.0.off,
            groups_div: FastDiv::new(groups as u32),
            heads_div: FastDiv::new(hk as u32),
        };
        let grid = chunks.min(sms * per_sm) as u32;
        // SAFETY: the parameters match the kernel's; addresses vouched for by the caller
        // (k, v, stream) or owned by `prep`, the cache and `self`.
        unsafe {
            launch_on(
                &self.gpu,
                f,
                (grid, 2 * d as u32),
                smem as u32,
                stream,
                false,
                &mut [arg(&mut prm)],
            )?;
        }
        Ok(())
    }

    /// Plans a decode of `p`'s queries over `cache` (`p.seqlens_k` must equal the cache's
    /// lengths): stream-K over `units` warps (default: every resident warp, at most one per
    /// 16-token iteration).
    pub fn prepare_decode(
        &self,
        p: &AttentionProblem,
        cache: &DeviceTurboQuantCache,
        units: Option<usize>,
    ) -> Result<PreparedTurboQuantDecode> {
        if p.seqlens_k != cache.lens || p.heads_kv != cache.heads_kv || p.batch != cache.batch {
            return Err(CudaError::Plan(format!(
                "the problem's keys (batch {}, {} KV heads, lengths {:?}) are not the cache's (batch {}, {} KV heads, lengths {:?})",
                p.batch, p.heads_kv, p.seqlens_k, cache.batch, cache.heads_kv, cache.lens
            )));
        }
        self.prepare_decode_for(p, units)
    }

    /// The default stream-K width of `p`'s decode ([`default_units`] over the warps of its
    /// decode kernel resident on this GPU; host only).
    pub fn default_units(&self, p: &AttentionProblem) -> usize {
        let r16 = p.group_size() * p.max_seqlen_q > 8;
        let sms = self.gpu.caps.compute_units;
        if !r16 && self.unit_warps_forced.is_none() && self.seven_fit && small_decode(p, sms) {
            return MAX_UNIT_WARPS_R8 * sms;
        }
        default_units(p, self.resident[r16 as usize], sms, self.unit_warps_for(p))
    }

    /// Warps per CTA of `p`'s decode launch: [`UNIT_WARPS`], or [`MAX_UNIT_WARPS_R8`] for the
    /// 8-row kernels at small work ([`small_decode`]), or `FERRATTN_TQ_UNIT_WARPS` (8 rows).
    pub fn unit_warps_for(&self, p: &AttentionProblem) -> usize {
        if p.group_size() * p.max_seqlen_q > 8 {
            return UNIT_WARPS;
        }
        match self.unit_warps_forced {
            Some(w) => w,
            None if self.seven_fit && small_decode(p, self.gpu.caps.compute_units) => {
                MAX_UNIT_WARPS_R8
            }
            None => UNIT_WARPS,
        }
    }

    /// [`TurboQuantDecodeTables::new`] with this GPU's default width when `units` is `None`
    /// (host only).
    pub fn decode_tables(
        &self,
        p: &AttentionProblem,
        units: Option<usize>,
    ) -> Result<TurboQuantDecodeTables> {
        if p.head_dim_qk != self.head_dim {
            return Err(CudaError::Plan(format!(
                "a decode of head dim {} on kernels of head dim {}",
                p.head_dim_qk, self.head_dim
            )));
        }
        TurboQuantDecodeTables::new(
            &self.cfg,
            p,
            units.unwrap_or_else(|| self.default_units(p)),
            self.gpu.caps.compute_units,
        )
    }

    /// [`Self::prepare_decode`] for caches that will hold `p.seqlens_k` tokens when the decode
    /// runs (a step planned before its append): [`Self::decode_tables`] made ready in memory
    /// of its own, allocated and copied here, synchronously (the convenience path; the device
    /// path puts the same tables into a caller's workspace, [`Self::upload_step`]).
    pub fn prepare_decode_for(
        &self,
        p: &AttentionProblem,
        units: Option<usize>,
    ) -> Result<PreparedTurboQuantDecode> {
        let t = self.decode_tables(p, units)?;
        let plan = TurboQuantStepPlan::new(Some(t), None);
        let step = self.prepare_owned(&plan)?;
        Ok(step.decode.expect("the plan decodes"))
    }

    /// Enqueues one decode: `q` (f16 `[batch, max_sq, heads_q, d]`) over `cache` into `out`.
    /// Allocates nothing and does not synchronise (graph-capturable).
    pub fn launch_decode(
        &self,
        prep: &PreparedTurboQuantDecode,
        q: &DeviceBuffer,
        cache: &DeviceTurboQuantCache,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        let p = &prep.problem;
        let need = p.batch * p.max_seqlen_q * p.heads_q * self.head_dim * 2;
        if q.bytes() < need || out.o.bytes() < need {
            return Err(CudaError::Plan(format!(
                "q / o buffers of {} / {} bytes, {need} needed",
                q.bytes(),
                out.o.bytes()
            )));
        }
        if self.poison {
            out.poison()?;
        }
        // SAFETY: q, o and lse are live buffers of this GPU of the sizes checked above (lse:
        // DeviceOutputs::alloc sizes it for the problem); the backend's own stream.
        unsafe {
            self.enqueue_decode(
                prep,
                q.ptr(),
                cache,
                out.o.ptr(),
                out.lse.ptr(),
                self.gpu.stream,
            )
        }
    }

    /// [`Self::launch_decode`] on raw device addresses and the caller's stream (context
    /// parallelism writes O and LSE into a rank's partial block): prepare, decode and combine
    /// enqueued on `stream`, nothing allocated, nothing synchronised.
    ///
    /// # Safety
    /// `q` holds f16 `[batch, max_sq, heads_q, d]`, `o` room for f16 `[batch, max_sq, heads_q,
    /// d]` and `lse` for f32 `[batch, heads_q, max_sq]` of `prep`'s problem, all on this GPU,
    /// 16-byte aligned; `stream` is a stream of this GPU's context (or null); the memory
    /// `prep`'s tables and scratch are in (its own, or the workspace of [`Self::upload_step`],
    /// whose copy is ordered before this launch) outlives the launches and is used by no
    /// launch on another stream meanwhile.
    pub unsafe fn enqueue_decode(
        &self,
        prep: &PreparedTurboQuantDecode,
        q: u64,
        cache: &DeviceTurboQuantCache,
        o: u64,
        lse: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &prep.problem;
        if p.seqlens_k != cache.lens {
            return Err(CudaError::Plan(format!(
                "the decode was planned for lengths {:?} but the cache holds {:?}",
                p.seqlens_k, cache.lens
            )));
        }
        if [q, o, lse].iter().any(|&a| a == 0 || a % 16 != 0) {
            return Err(CudaError::Plan(format!(
                "q, o and lse must be non-null and 16-byte aligned (got {q:#x}, {o:#x}, {lse:#x})"
            )));
        }
        let d = self.head_dim;
        let log2e = std::f32::consts::LOG2_E;
        let mut pp = PrepareParams {
            q,
            pit: self.pit.ptr(),
            st: self.st.ptr(),
            qf: prep.qf,
            qf_lo: prep.qf_lo,
            pf: prep.pf,
            seqlens_q: prep.seqlens_q,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            max_sq: p.max_seqlen_q as i32,
            qgroups: prep.qgroups as i32,
            heads_q: p.heads_q as i32,
            qjl: self.cfg.key_qjl as i32,
            batch_tiles: prep.tiles as i32,
            qscale: p.softmax_scale * log2e / self.sigma_k,
            pscale: p.softmax_scale * log2e * self.codec.sketch().correction_scale(),
        };
        // v1: one CTA per (tile, 32 output columns); spread: one per (tile, 8 columns)
        let spread = match self.prepare_kernel {
            PrepareKernel::Auto => prep.tiles <= PREPARE_SPREAD_MAX_TILES,
            k => k == PrepareKernel::Spread,
        };
        let (prepare, cols) = if spread {
            (&self.prepare_q, 8)
        } else {
            (&self.prepare_q_v1, 32)
        };
        // SAFETY: the parameter struct mirrors the kernel's and lives across the call; the
        // addresses are the caller's (this function's contract) and the engine's. Under PDL the
        // prepare reads only Πᵀ / Sᵀ before its wait and writes after it (see launch_step_kernel).
        unsafe {
            launch_step_kernel(
                &self.gpu,
                prepare,
                ((prep.tiles * d / cols) as u32, 128),
                0,
                stream,
                self.programmatic && self.prepare_pdl,
                &mut [arg(&mut pp)],
            )
        }?;
        let mut dp = DecodeParams {
            qf: prep.qf,
            qf_lo: prep.qf_lo,
            pf: prep.pf,
            kcodes: cache.kcodes.ptr(),
            ksigns: cache.ksigns.ptr(),
            knorms: cache.knorms.ptr(),
            vcodes: cache.vcodes.ptr(),
            vnorms: cache.vnorms.ptr(),
            segs: prep.segs,
            unit_segs: prep.unit_segs,
            part_o: prep.part_o,
            part_ml: prep.part_ml,
            seqlens_q: prep.seqlens_q,
            seqlens_k: prep.seqlens_k,
            units: prep.units as i32,
            heads_kv: p.heads_kv as i32,
            cap: cache.capacity as i32,
            qgroups: prep.qgroups as i32,
            group: p.group_size() as i32,
            max_sq: p.max_seqlen_q as i32,
            causal: p.causal as i32,
            late_ring: self.late_ring as i32,
            ktab: self.ktab,
            vtab: self.vtab,
        };
        // SAFETY (both launches): the parameter structs mirror the kernels' and live across the
        // calls; the addresses are the caller's (this function's contract) and the engine's.
        unsafe {
            launch_step_kernel(
                &self.gpu,
                &prep.decode,
                (
                    prep.units.div_ceil(prep.warps) as u32,
                    (prep.warps * 32) as u32,
                ),
                decode_smem_bytes(d, prep.warps) as u32,
                stream,
                self.programmatic,
                &mut [arg(&mut dp)],
            )
        }?;
        let mut cp = CombineParams {
            part_o: prep.part_o,
            part_ml: prep.part_ml,
            tile_segs: prep.tile_segs,
            pi: self.pi.ptr(),
            o,
            lse,
            seqlens_q: prep.seqlens_q,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            max_sq: p.max_seqlen_q as i32,
            qgroups: prep.qgroups as i32,
            heads_q: p.heads_q as i32,
            tiles: prep.tiles as i32,
            row_split: prep.row_split as i32,
            oscale: 1.0 / self.sigma_v,
        };
        let warps = merge_warps(prep.row_split, self.merge_forced);
        unsafe {
            launch_step_kernel(
                &self.gpu,
                if warps == 16 {
                    &self.combine_w16
                } else {
                    &self.combine
                },
                ((prep.tiles * prep.row_split) as u32, (warps * 32) as u32),
                0,
                stream,
                self.programmatic,
                &mut [arg(&mut cp)],
            )
        }
    }

    /// [`Self::append`] of device inputs' K and V (`x.problem.seqlens_k` tokens per sequence).
    pub fn compress_inputs(
        &self,
        cache: &mut DeviceTurboQuantCache,
        x: &crate::launch::DeviceInputs,
    ) -> Result<()> {
        let p = &x.problem;
        self.append(cache, &x.k, &x.v, p.max_seqlen_k, &p.seqlens_k)
    }

    /// [`Self::launch_decode`] with the queries of device inputs.
    pub fn launch_decode_inputs(
        &self,
        prep: &PreparedTurboQuantDecode,
        x: &crate::launch::DeviceInputs,
        cache: &DeviceTurboQuantCache,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        self.launch_decode(prep, &x.q, cache, out)
    }

    /// Allocates outputs for `p`.
    pub fn alloc_outputs(&self, p: &AttentionProblem) -> Result<DeviceOutputs> {
        DeviceOutputs::alloc(&self.gpu, p)
    }

    /// Downloads outputs.
    pub fn download(&self, out: &DeviceOutputs, p: &AttentionProblem) -> Result<AttentionOutput> {
        out.download(p, self.provenance.clone())
    }

    /// Uploads host f16 data of `t` (values must be representable; they are rounded).
    pub fn upload_f16(&self, data: &[f32]) -> Result<DeviceBuffer> {
        let bits: Vec<u16> = data.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
        DeviceBuffer::from_slice(&self.gpu, &bits)
    }

    /// [`ferrattn_core::turboquant::emulate`]'s semantics: compress K and V into a fresh cache
    /// and attend every query row over it (`units`: stream-K width, default every resident warp).
    pub fn run(
        &self,
        p: &AttentionProblem,
        x: &AttentionInputs,
        units: Option<usize>,
    ) -> Result<(AttentionOutput, DeviceTurboQuantCache)> {
        check_supported(&self.cfg, p)?;
        p.validate()?;
        let v = x.v.as_ref().ok_or_else(|| CudaError::Unsupported {
            what: "TurboQuant without a separate v tensor".into(),
            supported: "separate K and V".into(),
        })?;
        let k_d = self.upload_f16(&x.k.data)?;
        let v_d = self.upload_f16(&v.data)?;
        let q_d = self.upload_f16(&x.q.data)?;
        let mut cache = self.alloc_cache(p.batch, p.heads_kv, p.max_seqlen_k)?;
        self.append(&mut cache, &k_d, &v_d, p.max_seqlen_k, &p.seqlens_k)?;
        let prep = self.prepare_decode(p, &cache, units)?;
        let mut out = self.alloc_outputs(p)?;
        self.launch_decode(&prep, &q_d, &cache, &mut out)?;
        Ok((self.download(&out, p)?, cache))
    }
}

impl CudaBackend {
    /// The TurboQuant kernels of `cfg` for problems shaped like `p` (see [`TurboQuantCuda`]).
    pub fn turboquant(
        &self,
        cfg: &TurboQuantConfig,
        p: &AttentionProblem,
    ) -> Result<TurboQuantCuda> {
        TurboQuantCuda::new(self, cfg, p)
    }
}

/// The decode kernels' slow twin: `turboquant_prepare_q`, `turboquant_decode` and
/// `turboquant_combine` simulated lane by lane on the host, over the device layout of the cache
/// (the bytes [`layout`] describes), with `prmt` byte selection and the `mma.m16n8k16` fragment
/// layouts of the PTX ISA. The MMAs are exact products accumulated in f32 (the tensor cores'
/// rounding differs in the last bits). Host tests hold it against the emulation, so the
/// fragment bookkeeping is checked on every machine, GPU or not.
#[allow(clippy::needless_range_loop)] // lane-indexed arrays mirror the kernel's registers
pub mod twin {
    use super::{layout, schedule_tables, ROWS, TILE_K};
    use ferrattn_core::turboquant::{CompressedKv, TurboQuantCodec};
    use ferrattn_core::{AttentionProblem, Tensor};
    use half::f16;

    /// The device bytes of a cache (capacity rounded to 16 tokens), as the compression kernels
    /// write them.
    pub struct DeviceImage {
        cap: usize,
        kcodes: Vec<u8>,
        ksigns: Vec<u8>,
        knorms: Vec<u32>,
        vcodes: Vec<u8>,
        vnorms: Vec<u16>,
    }

    fn h(x: f32) -> u16 {
        f16::from_f32(x).to_bits()
    }
    fn f(x: u16) -> f32 {
        f16::from_bits(x).to_f32()
    }

    /// Lays a [`CompressedKv`] out as the device does.
    pub fn image(kv: &CompressedKv) -> DeviceImage {
        let (b_, hk, d) = (kv.batch, kv.heads_kv, kv.head_dim_k);
        let cap = kv.max_seqlen_k.div_ceil(TILE_K).max(1) * TILE_K;
        let rows = b_ * hk * cap;
        let mut im = DeviceImage {
            cap,
            kcodes: vec![0; rows * d / 2],
            ksigns: vec![0; rows * d / 8],
            knorms: vec![0; rows],
            vcodes: vec![0; rows * d / 2],
            vnorms: vec![0; rows],
        };
        for b in 0..b_ {
            for j in 0..kv.seqlens_k[b] {
                for hh in 0..hk {
                    let src = (b * kv.max_seqlen_k + j) * hk + hh;
                    let dst = (b * hk + hh) * cap + j;
                    im.kcodes[dst * d / 2..(dst + 1) * d / 2].copy_from_slice(
                        &layout::pack_key_codes(&kv.k_idx[src * d..(src + 1) * d]),
                    );
                    im.ksigns[dst * d / 8..(dst + 1) * d / 8].copy_from_slice(&layout::pack_signs(
                        d,
                        &kv.k_signs[src * d / 8..(src + 1) * d / 8],
                    ));
                    im.knorms[dst] = h(kv.k_norm[src]) as u32 | (h(kv.r_norm[src]) as u32) << 16;
                    im.vnorms[dst] = h(kv.v_norm[src]);
                    let pair = ((b * hk + hh) * cap) / 2 + j / 2;
                    for beta in 0..d {
                        let c = layout::value_byte_channel(d, beta);
                        im.vcodes[pair * d + beta] |= kv.v_idx[src * d + c] << (4 * (j % 2));
                    }
                }
            }
        }
        im
    }

    /// `prmt.b32` in its default mode.
    pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
        let bytes = (a as u64 | (b as u64) << 32).to_le_bytes();
        (0..4).fold(0u32, |r, i| {
            let n = (sel >> (4 * i)) & 15;
            let byte = bytes[(n & 7) as usize];
            let v = if n & 8 != 0 {
                if byte & 0x80 != 0 {
                    0xff
                } else {
                    0
                }
            } else {
                byte
            };
            r | (v as u32) << (8 * i)
        })
    }

    /// `lookup4` of the kernel.
    pub fn lookup4(w: u32, t: &[u32; 8], wide: bool) -> (u32, u32) {
        let (lo, hi) = if !wide {
            (prmt(t[0], t[1], w), prmt(t[4], t[5], w))
        } else {
            let sel = w & 0x7777;
            let pick = ((w >> 1) & 0x4444) | 0x3210;
            (
                prmt(prmt(t[0], t[1], sel), prmt(t[2], t[3], sel), pick),
                prmt(prmt(t[4], t[5], sel), prmt(t[6], t[7], sel), pick),
            )
        };
        (prmt(lo, hi, 0x5140), prmt(lo, hi, 0x7362))
    }

    fn signs2(w: u32, jj: u32) -> u32 {
        ((w << (15 - jj)) & 0x8000_8000) ^ 0xBC00_BC00
    }

    fn half2(w: u32) -> (f32, f32) {
        (f(w as u16), f((w >> 16) as u16))
    }

    /// `mma.m16n8k16` over a warp: `d[lane] += A B` with the fragments of every lane.
    fn mma(d: &mut [[f32; 4]; 32], a: &[[u32; 4]; 32], b0: &[u32; 32], b1: &[u32; 32]) {
        let mut am = [[0f32; 16]; 16];
        let mut bm = [[0f32; 8]; 16];
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for (r, (row, col)) in [
                (g, 2 * t),
                (g + 8, 2 * t),
                (g, 2 * t + 8),
                (g + 8, 2 * t + 8),
            ]
            .into_iter()
            .enumerate()
            {
                let (x, y) = half2(a[lane][r]);
                am[row][col] = x;
                am[row][col + 1] = y;
            }
            let (x, y) = half2(b0[lane]);
            bm[2 * t][g] = x;
            bm[2 * t + 1][g] = y;
            let (x, y) = half2(b1[lane]);
            bm[2 * t + 8][g] = x;
            bm[2 * t + 9][g] = y;
        }
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for (e, (row, col)) in [
                (g, 2 * t),
                (g, 2 * t + 1),
                (g + 8, 2 * t),
                (g + 8, 2 * t + 1),
            ]
            .into_iter()
            .enumerate()
            {
                let mut acc = d[lane][e];
                for k in 0..16 {
                    acc += (am[row][k] as f64 * bm[k][col] as f64) as f32;
                }
                d[lane][e] = acc;
            }
        }
    }

    fn words(bytes: &[u8]) -> Vec<u32> {
        bytes
            .chunks(4)
            .map(|c| {
                u32::from_le_bytes([
                    c[0],
                    c[1],
                    c.get(2).copied().unwrap_or(0),
                    c.get(3).copied().unwrap_or(0),
                ])
            })
            .collect()
    }

    /// Attention of `q` over the cache image, as the three kernels compute it, with `units`
    /// stream-K units. `p.seqlens_k` are the cache's lengths.
    pub fn decode(
        codec: &TurboQuantCodec,
        p: &AttentionProblem,
        q: &Tensor,
        im: &DeviceImage,
        units: usize,
    ) -> (Tensor, Vec<f32>) {
        let d = p.head_dim_qk;
        let (ch, nb) = (d / 16, d / 8);
        let group = p.group_size();
        let st = schedule_tables(p, units);
        let qjl = codec.key_qjl;
        let kwide = codec.key.mse().bits() == 4;
        let vwide = codec.value.bits() == 4;
        let kc = codec.key.mse().codebook().centroids_f32();
        let vc = codec.value.codebook().centroids_f32();
        let (sk, sv) = (super::f16_friendly_scale(kc), super::f16_friendly_scale(vc));
        let ktab = super::centroid_tables(&kc.iter().map(|c| c * sk).collect::<Vec<_>>());
        let vtab = super::centroid_tables(&vc.iter().map(|c| c * sv).collect::<Vec<_>>());
        let log2e = std::f32::consts::LOG2_E;
        let qscale = p.softmax_scale * log2e / sk;
        let pscale = p.softmax_scale * log2e * codec.sketch().correction_scale();
        let pi = codec.key_rotation().matrix();
        let sm = codec.sketch().matrix();
        // ---- prepare_q: A fragments per tile, [tile][lane][chunk][reg] f16x2
        let frag =
            |tile: usize, lane: usize, c: usize, r: usize| ((tile * 32 + lane) * ch + c) * 4 + r;
        let mut qf = vec![0u32; st.tiles * 32 * ch * 4];
        let mut qlo = qf.clone();
        let mut pf = qf.clone();
        for tile in 0..st.tiles {
            let (qg, hh, b) = (
                tile % st.qgroups,
                (tile / st.qgroups) % p.heads_kv,
                tile / (st.qgroups * p.heads_kv),
            );
            for r in 0..ROWS {
                let rr = qg * ROWS + r;
                let (hl, i) = (rr / p.max_seqlen_q, rr % p.max_seqlen_q);
                if hl >= group || i >= p.seqlens_q[b] {
                    continue;
                }
                let qrow = q.row4(b, i, hh * group + hl);
                for o in 0..d {
                    let rot: f32 = (0..d).map(|k| pi[o * d + k] * qrow[k]).sum::<f32>() * qscale;
                    let proj: f32 = (0..d).map(|k| sm[o * d + k] * qrow[k]).sum::<f32>() * pscale;
                    let (c, cc) = (o / 16, o % 16);
                    let (eta, e, t) = (cc / 8, cc % 2, (cc % 8) / 2);
                    let (lane, reg) = ((r % 8) * 4 + t, r / 8 + 2 * eta);
                    let hi = h(rot);
                    let at = frag(tile, lane, c, reg);
                    qf[at] |= (hi as u32) << (16 * e);
                    qlo[at] |= (h(rot - f(hi)) as u32) << (16 * e);
                    pf[at] |= (h(proj) as u32) << (16 * e);
                }
            }
        }
        // ---- decode: one warp per unit
        let n_segs = st.segs.len() / 4;
        let mut part_o = vec![0f32; n_segs * ROWS * d];
        let mut part_ml = vec![0f32; n_segs * ROWS * 2];
        for u in 0..st.units {
            for sgi in st.unit_segs[u] as usize..st.unit_segs[u + 1] as usize {
                let (tile, tok0, tok1) = (
                    st.segs[4 * sgi] as usize,
                    st.segs[4 * sgi + 1] as usize,
                    st.segs[4 * sgi + 2] as usize,
                );
                let (qg, hh, b) = (
                    tile % st.qgroups,
                    (tile / st.qgroups) % p.heads_kv,
                    tile / (st.qgroups * p.heads_kv),
                );
                let row_end = |r: usize| {
                    let rr = qg * ROWS + r;
                    let (hl, i) = (rr / p.max_seqlen_q, rr % p.max_seqlen_q);
                    if hl >= group || i >= p.seqlens_q[b] {
                        0
                    } else {
                        p.visible_keys(b, i)
                    }
                };
                let row0 = (b * p.heads_kv + hh) * im.cap;
                let mut o = [[[0f32; 4]; 32]; 32]; // [n-block][lane][e] (up to d = 256 / 8)
                let (mut m, mut l) = ([[f32::NEG_INFINITY; 2]; 32], [[0f32; 2]; 32]);
                let mut start = tok0;
                while start < tok1 {
                    let mut s0 = [[0f32; 4]; 32];
                    let mut s1 = s0;
                    let mut t0 = s0;
                    let mut t1 = s0;
                    let k0: Vec<Vec<u32>> = (0..32)
                        .map(|lane| {
                            let (g, q4) = (lane / 4, lane % 4);
                            let at = (row0 + start + g) * d / 2 + q4 * d / 8;
                            words(&im.kcodes[at..at + d / 8])
                        })
                        .collect();
                    let k1: Vec<Vec<u32>> = (0..32)
                        .map(|lane| {
                            let (g, q4) = (lane / 4, lane % 4);
                            let at = (row0 + start + g + 8) * d / 2 + q4 * d / 8;
                            words(&im.kcodes[at..at + d / 8])
                        })
                        .collect();
                    for w in 0..d / 32 {
                        for (kk, sacc) in [(&k0, &mut s0), (&k1, &mut s1)] {
                            let mut b_lo = [[0u32; 32]; 2];
                            let mut b_hi = [[0u32; 32]; 2];
                            for lane in 0..32 {
                                let (x0, x1) = lookup4(kk[lane][w], &ktab, kwide);
                                let (y0, y1) = lookup4(kk[lane][w] >> 16, &ktab, kwide);
                                b_lo[0][lane] = x0;
                                b_lo[1][lane] = x1;
                                b_hi[0][lane] = y0;
                                b_hi[1][lane] = y1;
                            }
                            for (chunk, bb) in [(2 * w, &b_lo), (2 * w + 1, &b_hi)] {
                                for src in [&qf, &qlo] {
                                    let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                                        std::array::from_fn(|r| src[frag(tile, lane, chunk, r)])
                                    });
                                    mma(sacc, &a, &bb[0], &bb[1]);
                                }
                            }
                        }
                    }
                    if qjl {
                        let sg = |tok: usize, lane: usize| -> u32 {
                            let at = (row0 + tok) * d / 8 + (lane % 4) * d / 32;
                            let wv = words(&im.ksigns[at..at + d / 32])[0];
                            if d == 128 {
                                wv
                            } else {
                                (wv & 0xff) | ((wv & 0xff00) << 8)
                            }
                        };
                        for c in 0..ch {
                            let a: [[u32; 4]; 32] = std::array::from_fn(|lane| {
                                std::array::from_fn(|r| pf[frag(tile, lane, c, r)])
                            });
                            for (off, tacc) in [(0usize, &mut t0), (8, &mut t1)] {
                                let b0: [u32; 32] = std::array::from_fn(|lane| {
                                    signs2(sg(start + lane / 4 + off, lane), 2 * c as u32)
                                });
                                let b1: [u32; 32] = std::array::from_fn(|lane| {
                                    signs2(sg(start + lane / 4 + off, lane), 2 * c as u32 + 1)
                                });
                                mma(tacc, &a, &b0, &b1);
                            }
                        }
                    }
                    // scores, masking, online softmax per lane (rows g, g + 8)
                    let mut pa = [[0u32; 4]; 32];
                    let mut sc_all = [[0f32; 8]; 32];
                    for lane in 0..32 {
                        let (g, q4) = (lane / 4, lane % 4);
                        let j0 = start + 2 * q4;
                        let kn = |t: usize| half2(im.knorms[row0 + t]);
                        let toks = [j0, j0 + 1, j0 + 8, j0 + 9];
                        let sv = [
                            s0[lane][0],
                            s0[lane][1],
                            s1[lane][0],
                            s1[lane][1],
                            s0[lane][2],
                            s0[lane][3],
                            s1[lane][2],
                            s1[lane][3],
                        ];
                        let tv = [
                            t0[lane][0],
                            t0[lane][1],
                            t1[lane][0],
                            t1[lane][1],
                            t0[lane][2],
                            t0[lane][3],
                            t1[lane][2],
                            t1[lane][3],
                        ];
                        let lims = [tok1.min(row_end(g)), tok1.min(row_end(g + 8))];
                        for e in 0..8 {
                            let (kk, rn) = kn(toks[e % 4]);
                            let mut x = kk * sv[e] + if qjl { rn * tv[e] } else { 0.0 };
                            if toks[e % 4] >= lims[e / 4] {
                                x = f32::NEG_INFINITY;
                            }
                            sc_all[lane][e] = x;
                        }
                    }
                    for lane in 0..32 {
                        let quad = lane & !3;
                        let mut pr = [0f32; 8];
                        for half in 0..2 {
                            let mx = (quad..quad + 4)
                                .flat_map(|l2| sc_all[l2][4 * half..4 * half + 4].to_vec())
                                .fold(f32::NEG_INFINITY, f32::max);
                            let mn = m[lane][half].max(mx);
                            let mu = if mn == f32::NEG_INFINITY { 0.0 } else { mn };
                            let al = (m[lane][half] - mu).exp2();
                            m[lane][half] = mn;
                            let mut sum = 0.0;
                            for e in 0..4 {
                                pr[4 * half + e] = (sc_all[lane][4 * half + e] - mu).exp2();
                                sum += pr[4 * half + e];
                            }
                            l[lane][half] = l[lane][half] * al + sum;
                            for nblk in o.iter_mut().take(nb) {
                                nblk[lane][2 * half] *= al;
                                nblk[lane][2 * half + 1] *= al;
                            }
                        }
                        let j0 = start + 2 * (lane % 4);
                        let vn = [j0, j0 + 1, j0 + 8, j0 + 9].map(|t| f(im.vnorms[row0 + t]));
                        let pv: [f32; 8] =
                            std::array::from_fn(
                                |e| if pr[e] == 0.0 { 0.0 } else { pr[e] * vn[e % 4] },
                            );
                        let pk = |a: f32, b2: f32| h(a) as u32 | (h(b2) as u32) << 16;
                        pa[lane] = [
                            pk(pv[0], pv[1]),
                            pk(pv[4], pv[5]),
                            pk(pv[2], pv[3]),
                            pk(pv[6], pv[7]),
                        ];
                    }
                    // O_rot += P' · c[idx_v]
                    let vw = |pair: usize, lane: usize| -> Vec<u32> {
                        let at = (row0 / 2 + pair) * d + (lane / 4) * d / 8;
                        words(&im.vcodes[at..at + d / 8])
                    };
                    let v0: Vec<Vec<u32>> =
                        (0..32).map(|lane| vw(start / 2 + lane % 4, lane)).collect();
                    let v1: Vec<Vec<u32>> = (0..32)
                        .map(|lane| vw(start / 2 + lane % 4 + 4, lane))
                        .collect();
                    for w in 0..d / 32 {
                        let mut bs = [[[0u32; 32]; 4]; 2];
                        for lane in 0..32 {
                            for (which, vv) in [(0usize, &v0), (1, &v1)] {
                                let (a0, a1) = lookup4(vv[lane][w], &vtab, vwide);
                                let (a2, a3) = lookup4(vv[lane][w] >> 16, &vtab, vwide);
                                bs[which][0][lane] = a0;
                                bs[which][1][lane] = a1;
                                bs[which][2][lane] = a2;
                                bs[which][3][lane] = a3;
                            }
                        }
                        for k in 0..4 {
                            mma(&mut o[4 * w + k], &pa, &bs[0][k], &bs[1][k]);
                        }
                    }
                    start += TILE_K;
                }
                for lane in 0..32 {
                    let (g, q4) = (lane / 4, lane % 4);
                    let quad = lane & !3;
                    for half in 0..2 {
                        let row = g + 8 * half;
                        let lsum: f32 = (quad..quad + 4).map(|l2| l[l2][half]).sum();
                        if q4 == 0 {
                            part_ml[(sgi * ROWS + row) * 2] = m[lane][half];
                            part_ml[(sgi * ROWS + row) * 2 + 1] = lsum;
                        }
                        for (n, nblk) in o.iter().take(nb).enumerate() {
                            part_o[(sgi * ROWS + row) * d + 8 * n + 2 * q4] = nblk[lane][2 * half];
                            part_o[(sgi * ROWS + row) * d + 8 * n + 2 * q4 + 1] =
                                nblk[lane][2 * half + 1];
                        }
                    }
                }
            }
        }
        // ---- combine
        let mut out = Tensor::zeros(&[p.batch, p.max_seqlen_q, p.heads_q, d], p.dtype);
        let mut lse = vec![f32::NEG_INFINITY; p.batch * p.heads_q * p.max_seqlen_q];
        let piv = codec.value_rotation().matrix();
        for tile in 0..st.tiles {
            let (qg, hh, b) = (
                tile % st.qgroups,
                (tile / st.qgroups) % p.heads_kv,
                tile / (st.qgroups * p.heads_kv),
            );
            let segs = st.tile_segs[tile] as usize..st.tile_segs[tile + 1] as usize;
            for r in 0..ROWS {
                let rr = qg * ROWS + r;
                let (hl, i) = (rr / p.max_seqlen_q, rr % p.max_seqlen_q);
                if hl >= group || i >= p.seqlens_q[b] {
                    continue;
                }
                let m = segs
                    .clone()
                    .map(|s| part_ml[(s * ROWS + r) * 2])
                    .fold(f32::NEG_INFINITY, f32::max);
                if m == f32::NEG_INFINITY {
                    continue;
                }
                let mut l = 0.0;
                let mut orot = vec![0f32; d];
                for s in segs.clone() {
                    let fct = (part_ml[(s * ROWS + r) * 2] - m).exp2();
                    l += part_ml[(s * ROWS + r) * 2 + 1] * fct;
                    for c in 0..d {
                        orot[c] += part_o[(s * ROWS + r) * d + c] * fct;
                    }
                }
                if l <= 0.0 {
                    continue;
                }
                let head = hh * group + hl;
                let dst = out.row4_mut(b, i, head);
                for (oo, x) in dst.iter_mut().enumerate() {
                    *x = (0..d)
                        .map(|k| piv[k * d + oo] * (orot[k] / l * (1.0 / sv)))
                        .sum();
                }
                lse[(b * p.heads_q + head) * p.max_seqlen_q + i] =
                    (m + l.log2()) * std::f32::consts::LN_2;
            }
        }
        (out, lse)
    }
}

impl ferrattn_core::backend::TurboQuantDecode for CudaBackend {
    /// [`ferrattn_core::turboquant::emulate`]'s semantics: K and V compressed by the kernels,
    /// every query row attended by the fused decode over the compressed cache (causal rows
    /// bottom-right), stream-K over every resident warp.
    fn run_turboquant(
        &self,
        plan: &ferrattn_core::AttentionPlan,
        x: &AttentionInputs,
    ) -> Result<AttentionOutput> {
        let ferrattn_core::PlanDetail::TurboQuant(cfg) = &plan.detail else {
            return Err(CudaError::Plan(format!(
                "run_turboquant was given a {} plan",
                plan.algorithm
            )));
        };
        let t = TurboQuantCuda::new(self, cfg, &plan.problem)?;
        Ok(t.run(&plan.problem, x, None)?.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_structs_match_the_kernel_layouts() {
        // pointers, ints, then float arrays (see the structs in turboquant_*.cu)
        assert_eq!(
            std::mem::size_of::<CompressParams>(),
            8 * 8 + 6 * 4 + 31 * 4 + 4
        );
        assert_eq!(
            std::mem::size_of::<FastCompressParams>(),
            // + the two FastDiv pairs (u32), then padding to 8
            10 * 8 + 6 * 4 + 35 * 4 + 4 * 4 + 4
        );
        assert_eq!(std::mem::size_of::<DecodeParams>(), 14 * 8 + 8 * 4 + 16 * 4);
        assert_eq!(
            std::mem::size_of::<PrepareParams>(),
            7 * 8 + 7 * 4 + 2 * 4 + 4
        );
        assert_eq!(std::mem::size_of::<CombineParams>(), 7 * 8 + 7 * 4 + 4);
    }

    #[test]
    fn the_16_warp_merge_serves_small_batches_only() {
        // batch 1 (8 tiles on 132 SMs): one CTA per row in use, 16 warps; batch 64: one CTA per
        // tile, 8 warps (the 16-warp merge lost 191 -> 205 µs there on an H200)
        let one = AttentionProblem::uniform(1, 1, 32768, 32, 8, 128, 128, DType::F16);
        let many = AttentionProblem::uniform(64, 1, 4096, 32, 8, 128, 128, DType::F16);
        let (r1, r64) = (row_split(&one, 8, 132), row_split(&many, 512, 132));
        assert_eq!((r1, r64), (4, 1));
        assert_eq!(merge_warps(r1, None), 16);
        assert_eq!(merge_warps(r64, None), COMBINE_WARPS);
        assert_eq!(merge_warps(r1, Some(8)), 8);
        assert_eq!(merge_warps(r64, Some(16)), 16);
    }

    #[test]
    fn the_small_work_schedule_takes_the_measured_regime_only() {
        // 8 to 16 iterations a warp at 12 warps per SM on 132 SMs: batch 1 at 32k (10.3), where
        // one 7-warp CTA per SM measured faster; not 1 x 128k (41, not measured that way), 16 x
        // 16k and 32 x 32k (83 and 248: measured slower), 1 x 16k (5.2, not measured), nor the
        // 16-row kernels (query length 4 with 4 query heads per KV head)
        let shape = |b, sq, ctx| AttentionProblem::uniform(b, sq, ctx, 32, 8, 128, 128, DType::F16);
        assert!(small_decode(&shape(1, 1, 32768), 132));
        for (b, sq, ctx) in [
            (1, 1, 131072),
            (16, 1, 16384),
            (32, 1, 32768),
            (1, 1, 16384),
            (1, 4, 32768),
        ] {
            assert!(!small_decode(&shape(b, sq, ctx), 132), "{b} x {sq} x {ctx}");
        }
        // a 7-warp CTA's rings and query fragments at d = 128 (the kernels' opt-in maximum)
        assert_eq!(decode_smem_bytes(128, MAX_UNIT_WARPS_R8), 111_104);
    }

    #[test]
    fn layouts_are_permutations_that_round_trip() {
        for d in [64usize, 128] {
            let mut seen = vec![false; d];
            for beta in 0..d / 2 {
                let c = layout::key_byte_channel(d, beta);
                assert!(c.is_multiple_of(2) && !seen[c] && !seen[c + 1]);
                seen[c] = true;
                seen[c + 1] = true;
            }
            let mut seen = vec![false; d];
            for bit in 0..d {
                let c = layout::sign_bit_channel(d, bit);
                assert!(!seen[c], "d {d} bit {bit}");
                seen[c] = true;
            }
            let mut seen = vec![false; d];
            for beta in 0..d {
                let c = layout::value_byte_channel(d, beta);
                assert!(!seen[c]);
                seen[c] = true;
            }
            let idx: Vec<u8> = (0..d).map(|i| ((i * 7 + 3) % 16) as u8).collect();
            assert_eq!(layout::unpack_key_codes(&layout::pack_key_codes(&idx)), idx);
            let signs: Vec<u8> = (0..d / 8).map(|i| (i * 37 + 11) as u8).collect();
            assert_eq!(
                layout::unpack_signs(d, &layout::pack_signs(d, &signs)),
                signs
            );
        }
    }

    #[test]
    fn key_layout_gives_each_lane_its_b_fragments() {
        // lane (g, q) reads bytes [q d/8, (q+1) d/8) of token g; its 32-bit word w holds, low 16
        // bits first, the b0/b1 pairs of chunks 2w and 2w + 1: (16κ + 2q, +1) then (16κ + 8 + 2q, +1)
        let d = 128;
        for q in 0..4 {
            for w in 0..d / 32 {
                for (half, kappa) in [(0usize, 2 * w), (1, 2 * w + 1)] {
                    let byte0 = q * d / 8 + 4 * w + 2 * half;
                    assert_eq!(layout::key_byte_channel(d, byte0), 16 * kappa + 2 * q);
                    assert_eq!(
                        layout::key_byte_channel(d, byte0 + 1),
                        16 * kappa + 8 + 2 * q
                    );
                }
            }
        }
        // signs: pair jj = 2κ + η of lane q at bits jj and jj + d/8 of its block
        for q in 0..4 {
            for jj in 0..d / 8 {
                let bit = q * d / 4 + jj;
                let c = 16 * (jj / 2) + 8 * (jj % 2) + 2 * q;
                assert_eq!(layout::sign_bit_channel(d, bit), c);
                assert_eq!(layout::sign_bit_channel(d, bit + d / 8), c + 1);
            }
        }
        // values: lane group g's byte ν is channel 8ν + g
        for g in 0..8 {
            for nu in 0..d / 8 {
                assert_eq!(layout::value_byte_channel(d, g * d / 8 + nu), 8 * nu + g);
            }
        }
    }

    #[test]
    fn centroid_tables_hold_low_then_high_bytes() {
        let t = centroid_tables(&[1.0, -2.0, 0.5]);
        // f16: 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800
        assert_eq!(t[0], 0x0000_0000);
        assert_eq!(t[4], 0x0038_c03c);
        assert_eq!(t[1..4], [0, 0, 0]);
    }

    #[test]
    fn closed_list_of_configurations() {
        let p = AttentionProblem::uniform(1, 1, 64, 8, 2, 128, 128, DType::F16);
        let mut cfg = TurboQuantConfig::paper_default(&p);
        let n = kernel_names(&cfg, &p).unwrap();
        assert_eq!(n.decode_r8, "turboquant_decode_d128_kqjl_v8_r8");
        assert_eq!(n.compress_keys, "turboquant_compress_keys_qjl_d128");
        cfg.key_qjl = false;
        assert_eq!(
            kernel_names(&cfg, &p).unwrap().decode_r16,
            "turboquant_decode_d128_kn16_v8_r16"
        );
        cfg.value_bits = 4;
        cfg.key_bits = 2;
        assert_eq!(
            kernel_names(&cfg, &p).unwrap().decode_r8,
            "turboquant_decode_d128_kn8_v16_r8"
        );
        let bad = |c: &TurboQuantConfig, p: &AttentionProblem| {
            matches!(kernel_names(c, p), Err(CudaError::Unsupported { .. }))
        };
        assert!(bad(
            &TurboQuantConfig {
                key_bits: 1,
                ..cfg.clone()
            },
            &p
        ));
        assert!(bad(
            &TurboQuantConfig {
                value_bits: 1,
                ..cfg.clone()
            },
            &p
        ));
        assert!(bad(
            &TurboQuantConfig {
                key_qjl: true,
                qjl_dim: 64,
                ..cfg.clone()
            },
            &p
        ));
        let p96 = AttentionProblem::uniform(1, 1, 64, 8, 2, 96, 96, DType::F16);
        assert!(bad(&cfg, &p96));
        let pbf = AttentionProblem::uniform(1, 1, 64, 8, 2, 128, 128, DType::BF16);
        assert!(bad(&cfg, &pbf));
    }

    /// LLM-like inputs rounded to f16, as the GPU tests use.
    fn f16_inputs(p: &AttentionProblem, seed: u64) -> AttentionInputs {
        let mut x = ferrattn_core::turbo::llm_like_inputs(p, seed);
        for t in [&mut x.q, &mut x.k, x.v.as_mut().unwrap()] {
            t.data.iter_mut().for_each(|v| *v = DType::F16.round(*v));
        }
        x.seqlens_q = Some(p.seqlens_q.iter().map(|&l| l as i64).collect());
        x.seqlens_k = Some(p.seqlens_k.iter().map(|&l| l as i64).collect());
        x
    }

    #[test]
    fn the_kernels_twin_matches_the_emulation() {
        use ferrattn_core::Comparison;
        // (query lengths, key lengths, Hq, Hk, d, causal, units): GQA 4 at query length 1
        // (rows 8-15 unused), 16 rows of GQA 3 x 5 tokens, two query groups, an empty sequence,
        // lengths off the 16-token tile, causal, stream-K splits inside tiles
        type Case = (Vec<usize>, Vec<usize>, usize, usize, usize, bool, usize);
        let cases: Vec<Case> = vec![
            (vec![1, 1, 1], vec![37, 0, 70], 8, 2, 64, false, 5),
            (vec![5, 2], vec![45, 33], 12, 4, 64, true, 3),
            (vec![4], vec![100], 16, 2, 128, true, 2),
            (vec![1], vec![129], 8, 2, 128, false, 1),
        ];
        for (lq, lk, hq, hk, d, causal, units) in cases {
            let mut p = AttentionProblem::uniform(
                lq.len(),
                *lq.iter().max().unwrap(),
                *lk.iter().max().unwrap(),
                hq,
                hk,
                d,
                d,
                DType::F16,
            );
            p.seqlens_q = lq.clone();
            p.seqlens_k = lk.clone();
            p.causal = causal;
            let x = f16_inputs(&p, 3 + d as u64);
            for (key_bits, key_qjl, value_bits) in
                [(4u8, true, 3u8), (4, false, 4), (2, true, 2), (3, false, 2)]
            {
                let cfg = TurboQuantConfig {
                    key_bits,
                    key_qjl,
                    value_bits,
                    ..TurboQuantConfig::paper_default(&p)
                };
                let codec = TurboQuantCodec::new(&cfg, d, d);
                let kv = codec.compress(&p, &x);
                let (o, lse) = twin::decode(&codec, &p, &x.q, &twin::image(&kv), units);
                let emu = codec.attend(&cfg, &p, &x.q, &kv);
                let f64s = |v: &[f32]| v.iter().map(|&y| y as f64).collect::<Vec<_>>();
                let co = Comparison::new(&f64s(&emu.o.data), &f64s(&o.data));
                let cl = Comparison::new(&f64s(&emu.lse.data), &f64s(&lse));
                let what = format!("k{key_bits} qjl {key_qjl} v{value_bits} lq {lq:?} lk {lk:?} {hq}/{hk} d {d} causal {causal} units {units}");
                assert!(
                    co.non_finite_mismatch.is_none() && cl.non_finite_mismatch.is_none(),
                    "{what}"
                );
                assert!(co.rel_fro < 1e-3, "{what}: O rel_fro {:e}", co.rel_fro);
                // LSE relative to max(1, |LSE|): each logit carries up to four f16 roundings
                // (S q, the key centroid, and through P and the value centroid the weights),
                // each at most 2^-11 relative, so 4 · 2^-11 ≈ 2e-3 of the logit scale
                let worst_rel = emu
                    .lse
                    .data
                    .iter()
                    .zip(&lse)
                    .filter(|(a, _)| a.is_finite())
                    .map(|(a, b)| ((a - b).abs() / a.abs().max(1.0)) as f64)
                    .fold(0.0, f64::max);
                eprintln!(
                    "{what}: O rel_fro {:.2e}, LSE max abs {:.2e}, max rel {worst_rel:.2e}",
                    co.rel_fro, cl.max_abs
                );
                assert!(worst_rel < 2e-3, "{what}: LSE relative error {worst_rel:e}");
            }
        }
    }

    #[test]
    fn scaled_codebooks_round_to_f16_almost_exactly() {
        // one factor per codebook brings every centroid within 2^-13 relative of an f16 value
        // (plain f16 rounding: up to 2^-11)
        for d in [64usize, 128] {
            for bits in 1u8..=4 {
                let c = ferrattn_core::turboquant::codebook(bits, d);
                let cents = c.centroids_f32();
                let sigma = f16_friendly_scale(cents);
                assert!((1.0..2.0).contains(&sigma));
                let worst = cents
                    .iter()
                    .map(|&x| {
                        let y = sigma * x;
                        ((f16::from_f32(y).to_f32() - y) / y).abs()
                    })
                    .fold(0.0f32, f32::max);
                assert!(worst < 2f32.powi(-13), "d {d} bits {bits}: {worst:e}");
            }
        }
    }

    /// The contract check itself: the emulation's own cache passes every path with nothing
    /// counted; a code moved to a neighbour far from any boundary, a flipped QJL sign and a
    /// norm one ulp off are refused by the exact contract, and the code and the norm by the
    /// fast one too.
    #[test]
    fn compress_contract_check_refuses_what_its_path_does_not_allow() {
        let mut p = AttentionProblem::uniform(2, 1, 9, 4, 2, 64, 64, DType::F16);
        p.seqlens_k = vec![9, 5];
        let mut x = ferrattn_core::turbo::llm_like_inputs(&p, 3);
        let round = |t: &mut ferrattn_core::Tensor| {
            t.data.iter_mut().for_each(|v| *v = DType::F16.round(*v))
        };
        round(&mut x.k);
        round(x.v.as_mut().unwrap());
        x.seqlens_k = Some(vec![9, 5]);
        let cfg = TurboQuantConfig::paper_default(&p);
        let codec = TurboQuantCodec::new(&cfg, 64, 64);
        let kv = codec.compress(&p, &x);
        for path in [CompressPath::Exact, CompressPath::Fast, CompressPath::Split] {
            let m = check_compress_contract(&p, &x, &cfg, &kv, path).unwrap();
            assert_eq!(m, ContractCounts::default(), "{path:?}");
        }
        // the coordinate farthest from any boundary, moved to a neighbouring code
        let (mut idx, mut rot) = (vec![0u8; 64], vec![0f32; 64]);
        codec
            .key
            .mse()
            .quantize_into(&x.k.row4(0, 0, 0)[..64], &mut idx, &mut rot);
        let bounds = codec.key.mse().codebook().boundaries_f32();
        let dist = |y: f32| {
            bounds
                .iter()
                .map(|&b| (y - b).abs())
                .fold(f32::MAX, f32::min)
        };
        let o = (0..64)
            .max_by(|&a, &b| dist(rot[a]).total_cmp(&dist(rot[b])))
            .unwrap();
        assert!(dist(rot[o]) > FAST_CODE_MARGIN);
        let mut bad = kv.clone();
        bad.k_idx[o] = if idx[o] == 0 { 1 } else { idx[o] - 1 };
        for path in [CompressPath::Exact, CompressPath::Fast, CompressPath::Split] {
            let e = check_compress_contract(&p, &x, &cfg, &bad, path).unwrap_err();
            assert!(e.contains("coordinate"), "{path:?}: {e}");
        }
        let mut bad = kv.clone();
        bad.k_signs[0] ^= 1;
        let e = check_compress_contract(&p, &x, &cfg, &bad, CompressPath::Exact).unwrap_err();
        assert!(e.contains("sign 0"), "{e}");
        let mut bad = kv.clone();
        bad.v_norm[1] = f32::from_bits(bad.v_norm[1].to_bits() + 1);
        for path in [CompressPath::Exact, CompressPath::Fast] {
            let e = check_compress_contract(&p, &x, &cfg, &bad, path).unwrap_err();
            assert!(e.contains("norms"), "{path:?}: {e}");
        }
    }

    #[test]
    fn fast_div_equals_integer_division() {
        let mut ds: Vec<u32> = (1..=300).collect();
        ds.extend([
            511,
            512,
            513,
            4095,
            4096,
            4097,
            65_535,
            65_537,
            1 << 20,
            12_345_679,
        ]);
        for d in ds {
            let f = FastDiv::new(d);
            let mut ns: Vec<u32> = (0..2000).collect();
            ns.extend([(1 << 31) - 1, (1 << 31) - 2, (1 << 30) + 7, 123_456_789]);
            ns.extend((1..64).flat_map(|k| [k * d - 1, k * d, k * d + 1]));
            ns.extend((1..64).map(|k| ((1u64 << 31) - 1 - k as u64 * d as u64 % (1 << 31)) as u32));
            for n in ns.into_iter().filter(|&n| n < 1 << 31) {
                assert_eq!(f.div(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn code_lookup_equals_the_codebook_index() {
        for d in [64, 128] {
            for bits in 1..=4u8 {
                let cb = ferrattn_core::turboquant::codebook(bits, d);
                let (b, c) = (cb.boundaries_f32(), cb.centroids_f32());
                let lut = CodeLut::new(b, c);
                let mut ys: Vec<f32> = vec![0.0, -0.0, 1.0, -1.0, 1e-30, lut.lo, lut.hi];
                // every boundary and its neighbours to 64 ulps, and a fine sweep
                for &x in b {
                    let mut up = x;
                    let mut dn = x;
                    ys.push(x);
                    for _ in 0..64 {
                        up = up.next_up();
                        dn = dn.next_down();
                        ys.extend([up, dn]);
                    }
                }
                ys.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 4e-6));
                for &y in &ys {
                    let want = cb.index(y);
                    let (got, cent) = lut.code(y);
                    assert_eq!(got, want, "bits {bits} d {d}: y = {y:e}");
                    assert_eq!(cent.to_bits(), cb.centroid(want).to_bits());
                }
            }
        }
    }

    #[test]
    fn fast_matrices_split_pi_and_fold_the_sketch() {
        let cfg = TurboQuantConfig::paper_default(&AttentionProblem::uniform(
            1,
            1,
            16,
            8,
            2,
            64,
            64,
            DType::F16,
        ));
        let codec = TurboQuantCodec::new(&cfg, 64, 64);
        let (pi, s) = (codec.key_rotation().matrix(), codec.sketch().matrix());
        let (hi, lo, m) = fast_matrices(pi, s, 64);
        let f = |b: u16| f16::from_bits(b).to_f64();
        for i in 0..64 * 64 {
            // hi + lo carries Π to about 2^-22 of its magnitude (f16 subnormals: 2^-25 absolute)
            let e = (f(hi[i]) + f(lo[i]) - pi[i] as f64).abs();
            assert!(
                e <= (pi[i].abs() as f64) * 2f64.powi(-21) + 2f64.powi(-25),
                "{i}: {e:e}"
            );
        }
        // (S Πᵀ) Π = S: the folded sketch applied to a rotated vector is the sketch of the vector
        let x: Vec<f64> = (0..64)
            .map(|k| ((k * 37 % 11) as f64 - 5.0) / 7.0)
            .collect();
        let rot: Vec<f64> = (0..64)
            .map(|o| (0..64).map(|k| pi[o * 64 + k] as f64 * x[k]).sum())
            .collect();
        for i in 0..64 {
            let want: f64 = (0..64).map(|k| s[i * 64 + k] as f64 * x[k]).sum();
            let got: f64 = (0..64).map(|k| f(m[i * 64 + k]) * rot[k]).sum();
            let norm: f64 = (0..64)
                .map(|k| (s[i * 64 + k] as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            let xn: f64 = x.iter().map(|v| v * v).sum::<f64>().sqrt();
            assert!(
                (got - want).abs() <= 2f64.powi(-10) * norm * xn,
                "row {i}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn compression_kernels_fit_in_shared_memory() {
        // two fast CTAs per SM (227 KB each SM on sm_90)
        assert!(2 * fast_compress_smem_bytes(128, true) <= 227 * 1024);
        // keys with QJL at d = 128: Π and S padded, f32, plus the rows: within 227 KiB
        assert!(compress_smem_bytes(128, true) <= 227 * 1024);
        assert_eq!(
            compress_smem_bytes(64, false),
            4 * (64 * 68 + 32 * 68 + 32) + 32 * 64
        );
    }

    /// A step's workspace: every region aligned, inside `workspace_bytes`, none overlapping;
    /// the tables image holds exactly the kernels' tables (the schedule's, the lengths, the
    /// append's destinations and counts) at their offsets.
    #[test]
    fn step_workspace_regions_are_aligned_disjoint_and_hold_the_tables() {
        let probe = AttentionProblem::uniform(1, 1, 1, 1, 1, 128, 128, DType::F16);
        for qjl in [true, false] {
            let mut cfg = TurboQuantConfig::paper_default(&probe);
            cfg.key_qjl = qjl;
            if !qjl {
                cfg.qjl_dim = 0;
            }
            let mut p = AttentionProblem::uniform(3, 1, 1001, 32, 8, 128, 128, DType::F16);
            p.seqlens_k = vec![1001, 1, 577];
            let dec = TurboQuantDecodeTables::new(&cfg, &p, 264, 132).unwrap();
            let app = TurboQuantAppendTables::new(&[1000, 0, 576], &[1, 1, 1], 1, 1008).unwrap();
            let plan = TurboQuantStepPlan::new(Some(dec.clone()), Some(app));
            let (r, a) = (plan.dec.unwrap(), plan.app.unwrap());
            let frag = dec.tiles * 32 * 128 * 2;
            let mut regions = vec![
                (a.dst0, 3 * 4),
                (a.count, 3 * 4),
                (r.segs, dec.segs.len() * 4),
                (r.unit_segs, dec.unit_segs.len() * 4),
                (r.tile_segs, dec.tile_segs.len() * 4),
                (r.seqlens_q, 3 * 4),
                (r.seqlens_k, 3 * 4),
                (r.qf, frag),
                (r.qf_lo, frag),
                (r.pf, if qjl { frag } else { 4 }),
                (r.part_o, dec.segments * ROWS * 128 * 4),
                (r.part_ml, dec.segments * ROWS * 2 * 4),
            ];
            regions.sort();
            for w in regions.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?} overlap");
            }
            for &(at, n) in &regions {
                assert_eq!(at % TURBOQUANT_WORKSPACE_ALIGN, 0);
                assert!(at + n <= plan.workspace_bytes());
            }
            assert_eq!(plan.workspace_bytes() % TURBOQUANT_WORKSPACE_ALIGN, 0);
            // the tables come first, the scratch after them
            assert!(plan.table_bytes() <= r.qf);
            let word = |at: usize, i: usize| {
                i32::from_le_bytes(plan.image[at + 4 * i..at + 4 * i + 4].try_into().unwrap())
            };
            assert_eq!(
                (0..3).map(|i| word(a.dst0, i)).collect::<Vec<_>>(),
                [1000, 0, 576]
            );
            assert_eq!(
                (0..3).map(|i| word(a.count, i)).collect::<Vec<_>>(),
                [1, 1, 1]
            );
            assert_eq!(
                (0..3).map(|i| word(r.seqlens_k, i)).collect::<Vec<_>>(),
                [1001, 1, 577]
            );
            let segs: Vec<i32> = (0..dec.segs.len()).map(|i| word(r.segs, i)).collect();
            assert_eq!(segs, dec.segs);
            let ts: Vec<i32> = (0..dec.tile_segs.len())
                .map(|i| word(r.tile_segs, i))
                .collect();
            assert_eq!(ts, dec.tile_segs);
            // a decode-only step: no append tables, a smaller workspace
            let alone = TurboQuantStepPlan::new(Some(dec.clone()), None);
            assert!(alone.workspace_bytes() < plan.workspace_bytes() && alone.app.is_none());
        }
        // a width of 0 and an append past the capacity are refused
        let cfg = TurboQuantConfig::paper_default(&probe);
        let p = AttentionProblem::uniform(1, 1, 16, 8, 8, 128, 128, DType::F16);
        assert!(TurboQuantDecodeTables::new(&cfg, &p, 0, 132).is_err());
        assert!(TurboQuantAppendTables::new(&[1000], &[9], 9, 1008).is_err());
    }
}
