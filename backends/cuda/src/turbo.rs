//! TurboAttention on CUDA (Kang et al., MLSys 2025): INT8 tensor-core prefill (Alg. 1) and
//! decode (Alg. 2) over a compressed KV cache, with SAS (section 4).
//!
//! The numeric contract is `ferrattn_core::turbo` (its module docs): the kernels in
//! `cuda-kernels/turbo_prefill.cu` and `cuda-kernels/turbo_decode.cu` perform the emulation's
//! integer and `f32` steps in its order, so
//! - the cache they write (packed codes, channel scales and zero points, block scales, INT8
//!   buffer, universal scales) equals [`ferrattn_core::turbo::TurboKvCache`] bit for bit
//!   ([`DeviceTurboCache::download`]);
//! - prefill O of the mma.sync kernel (`turbo_prefill_*`) equals [`ferrattn_core::turbo::prefill`]'s
//!   bit for bit with SAS on (LSE up to `logf`'s last bit; with SAS off P goes through `expf`,
//!   whose last bit differs from the host's); the warpgroup-MMA kernel (`turbo_prefill_wg_*`, the
//!   default on compute capability 9.0, see [`crate::Options::exact_turbo_prefill`]) multiplies by
//!   `1 / s_P` instead of dividing, so a P code can move by one at a rounding boundary: O within
//!   1e-3 of the emulation;
//! - decode under [`DecodeSchedule::PerTile`] replays the emulation's tile order
//!   (bit-identical O); under [`DecodeSchedule::StreamK`] (equal ranges) and
//!   [`DecodeSchedule::Balanced`] (ranges cut by cost, the automatic schedule) the KV length is
//!   split over CTAs as in LeanAttention (appendix E) and the partials are merged with the configuration's exponential,
//!   which [`decode_twin`] reproduces on the CPU bit for bit. That is the bit-exact decode
//!   (`turbo_decode_*`, `turbo_decode_g4_*`), the default off sm_90 and with
//!   [`crate::Options::exact_turbo_decode`]; on sm_90 the default is the fast-contract decode
//!   (`turbo_decode_*fast*`: MUFU exponentials, P against the tile's known maximum; O within
//!   2e-2 and LSE within 1e-2 of the bit-exact result, `docs/TURBO_CUDA.md`).
//!
//! What runs where:
//! - [`CudaBackend::turbo_prefill`]: Q, K, V (f16/bf16) in; O, LSE and a [`DeviceTurboCache`] out.
//! - [`CudaBackend::turbo_decode`] / [`CudaBackend::turbo_decode_step`]: one query token per
//!   sequence over a device cache (ragged lengths, INT8 buffer included); `turbo_append` quantizes
//!   new tokens into the buffer and flushes full buffers into compressed blocks on the device.
//! - [`ferrattn_core::backend::TurboAttention::run_turbo`]: the semantics of
//!   [`ferrattn_core::turbo::emulate`] (prefill where `Sq >= Sk`, context compression then
//!   token-by-token decode where `Sq < Sk`).
//!
//! Supported (a closed list; everything else is [`CudaError::Unsupported`]): f16/bf16, head dim
//! 64 or 128 (`head_dim_qk == head_dim_v`), `B_r = B_c = n_b = 64`, any SAS threshold the core
//! accepts and SAS off, KV bits 4, 2, mixed or per head, any GQA ratio, causal (bottom-right) or
//! not, ragged lengths. Per-head bit widths are resolved on the host from the host tensors (the
//! head priorities of section 3.2 are `f64` statistics of the context).

// The launch-only entry points of the device path (issue 9): a child module, so it fills this
// module's parameter blocks and cache fields without widening their visibility.
#[path = "turbo_device.rs"]
pub mod device;

use crate::device::{DeviceBuffer, Gpu};
use crate::error::{check, CudaError, Result};
use crate::kernels::{self, Function, Module};
use crate::launch::{launch_programmatic, DeviceInputs, DeviceOutputs};
use crate::CudaBackend;
use cudarc::driver::sys;
use ferrattn_core::turbo::cache::{resolve_bits, Int8Buffer, SeqCache, TensorCache};
use ferrattn_core::turbo::quant::{packed_block_bytes, ChannelParams, PackedBlock};
use ferrattn_core::turbo::{self, CacheMemory, TurboConfig, TurboKvCache};
use ferrattn_core::{
    AttentionInputs, AttentionOutput, AttentionProblem, DType, Provenance, Tensor,
};
use half::{bf16, f16};
use std::sync::Arc;

/// Query rows and keys per tile, tokens per cache block and buffer capacity (`kBlock`).
pub const TURBO_BLOCK: usize = 64;
/// Threads per CTA of every TurboAttention kernel (`kThreads`).
pub const TURBO_THREADS: u32 = 128;
pub use ferrattn_core::turbo::decode_plan::{DECODE_ROWS, DECODE_UNITS_PER_CTA};
const _: () = assert!(
    DECODE_UNITS_PER_CTA == TURBO_THREADS as usize / 32,
    "one unit per warp"
);
const _: () = assert!(TURBO_BLOCK == ferrattn_core::turbo::decode_plan::DECODE_BLOCK);

/// Dynamic shared memory of a decode CTA (mirrors `UnitStage<D>` of turbo_decode.cu): per warp
/// one tile's K half (4-bit codes of 64 tokens, channel parameters, both block scales and clamp
/// flags) and one tile's V half (codes, channel parameters), refilled apart.
pub fn decode_smem_bytes(head_dim: usize) -> usize {
    let stage = 2 * (TURBO_BLOCK * head_dim / 2) + 4 * head_dim + 16;
    DECODE_UNITS_PER_CTA * stage
}

/// Largest GQA group the `turbo_decode_g4_*` instance serves ([`TurboKernels::decode_for`]).
pub const DECODE_G4_MAX_GROUP: usize = DECODE_ROWS / 2;

/// Rows of the combine grid (`turbo_combine_*`, one CTA per query row of an output tile): the
/// rows that can hold a query head, `min(DECODE_ROWS, group)`. The kernel returns at once for a
/// row past its tile's heads, but launching those CTAs is not free: at Llama's group of 4 half
/// of a `DECODE_ROWS`-row grid is such rows, and at 64 sequences x 8 KV heads (4,096 CTAs of
/// 128 threads) the whole grid took two waves of the GPU instead of one (issue 11,
/// docs/TURBO_CUDA.md).
pub(crate) fn combine_rows(heads_q: usize, heads_kv: usize) -> usize {
    (heads_q / heads_kv).clamp(1, DECODE_ROWS)
}

/// Threads of a `turbo_combine_*` CTA: one warp merges one query row (`kCombineThreads` of
/// `cuda-kernels/turbo_decode.cu`).
pub const TURBO_COMBINE_THREADS: u32 = 32;

/// The launch shape of a warpgroup-MMA prefill kernel: Q blocks (consumer warpgroups) per CTA,
/// threads per CTA (the consumers and one producer warpgroup) and K/V tiles in flight; mirrors
/// `kWg*` (`turbo_prefill_wg_*`) and `kWgf*` (`turbo_prefill_wgf_*`) of
/// `cuda-kernels/turbo_prefill.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgShape {
    /// 64-row Q blocks per CTA, one per consumer warpgroup.
    pub q_blocks: usize,
    /// Threads per CTA: 128 per consumer warpgroup and 128 for the producer.
    pub threads: u32,
    /// K/V tiles in the shared-memory ring.
    pub stages: usize,
    /// The CTA's Q blocks are consecutive items of its KV head's (query block, query head)
    /// list, so they may belong to different query heads of the GQA group (`wgf_cta` of
    /// turbo_prefill.cu); else they are consecutive blocks of one query head.
    pub grouped: bool,
}

/// `turbo_prefill_wg_*`: three consumer warpgroups of 160 registers, four tiles in flight.
pub const WG_SHAPE: WgShape = WgShape {
    q_blocks: 3,
    threads: 512,
    stages: 4,
    grouped: false,
};
/// `turbo_prefill_wgf_*`: three consumer warpgroups of 160 registers (the S of a chunk of
/// two tiles in one pair of buffers), eight tiles in flight (`kWgf*`).
pub const WGF_SHAPE: WgShape = WgShape {
    q_blocks: 3,
    threads: 512,
    stages: 8,
    grouped: true,
};

impl WgShape {
    /// Dynamic shared memory: the ring of INT8 K and V^T tiles, one INT8 Q block per consumer
    /// warpgroup, and the slack that aligns them to 1 KiB.
    pub fn smem_bytes(&self, head_dim: usize) -> u32 {
        ((self.stages * 2 + self.q_blocks) * TURBO_BLOCK * head_dim + 1024) as u32
    }

    /// The grid of a prefill and `PrefillParams::order`. Not `grouped`: `(CTAs per query
    /// head, query heads, batch)`, order 0. `grouped` (`wgf_cta` of turbo_prefill.cu): each CTA
    /// takes `q_blocks` items of its KV head's `group x ceil(max_seqlen_q / 64)` (query block,
    /// query head) pairs, `trips` CTAs per KV head; order 1 (trip-major, grid `(KV heads, batch,
    /// trips)`: the longest causal query blocks of every head and sequence dispatched first) for
    /// causal prefill where `trips` fits the grid's z, order 0 (grid `(trips, KV heads, batch)`)
    /// otherwise. `FERRATTN_WGF_ORDER` (`head` or `trip`, read once) overrides the choice, a
    /// measurement hook (docs/TURBO_CUDA.md).
    pub fn launch_grid(
        &self,
        causal: bool,
        max_seqlen_q: usize,
        heads_q: usize,
        heads_kv: usize,
        batch: usize,
    ) -> ((usize, usize, usize), i32) {
        let q_blocks = max_seqlen_q.div_ceil(TURBO_BLOCK);
        if !self.grouped {
            return ((q_blocks.div_ceil(self.q_blocks), heads_q, batch), 0);
        }
        static OVERRIDE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
        let forced =
            OVERRIDE.get_or_init(|| match std::env::var("FERRATTN_WGF_ORDER").as_deref() {
                Ok("head") => Some(false),
                Ok("trip") => Some(true),
                _ => None,
            });
        let trips = (q_blocks * (heads_q / heads_kv)).div_ceil(self.q_blocks);
        if forced.unwrap_or(causal) && trips <= 65535 {
            ((heads_kv, batch, trips), 1)
        } else {
            ((trips, heads_kv, batch), 0)
        }
    }
}

// ---- kernel parameter blocks, mirrored by the structs of turbo_common.cuh and the .cu files ----

/// `struct CacheView`: one tensor (K or V) of the cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CacheView {
    codes: u64,
    par: u64,
    bscale: u64,
    buf: u64,
    buf_scale: u64,
    clamp: u64,
}

/// `struct CacheParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CacheParams {
    k: CacheView,
    v: CacheView,
    head_bits: u64,
    head_off: u64,
    seq_code_bytes: u64,
    cap_blocks: i32,
    heads_kv: i32,
}

/// `struct QuantParams` (turbo_prefill.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct QuantParams {
    k: u64,
    v: u64,
    lens: u64,
    kq: u64,
    vt: u64,
    ks: u64,
    vs: u64,
    cache: CacheParams,
    batch: i32,
    max_s: i32,
    heads_kv: i32,
    nblk: i32,
    image: i32,
}

/// `struct PrefillParams` (turbo_prefill.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct PrefillParams {
    q: u64,
    o: u64,
    lse: u64,
    seqlens_q: u64,
    seqlens_k: u64,
    kq: u64,
    vt: u64,
    ks: u64,
    vs: u64,
    batch: i32,
    max_sq: i32,
    heads_q: i32,
    heads_kv: i32,
    group: i32,
    nblk: i32,
    causal: i32,
    sas: i32,
    sas_nr: i32,
    softmax_scale: f32,
    /// `turbo_prefill_wgf_*`: the CTA order of a grouped grid ([`WgShape::launch_grid`]).
    order: i32,
    /// `turbo_prefill_wgf_*`: 0, or [`TRACE_WORDS`] u64 per CTA (`FERRATTN_WGF_TRACE`).
    trace: u64,
    /// `turbo_prefill_wgf_*`: the INT8 Q tiles `turbo_quant_q_*` wrote, `[batch, heads_q,
    /// ceil(max_seqlen_q / 64), 64, D]` in the K-tile image layout; 0 for the other kernels.
    qq: u64,
    /// `turbo_prefill_wgf_*`: their block scales s_Q (f32), `[batch, heads_q, ceil(max_seqlen_q
    /// / 64)]`; 0 for the other kernels.
    qs: u64,
}

/// Bytes of the INT8 Q tiles and of their scales `turbo_quant_q_*` writes for the fast prefill
/// of `p`.
pub(crate) fn q_tile_bytes(p: &AttentionProblem) -> (usize, usize) {
    let blocks = p.batch * p.heads_q * p.max_seqlen_q.div_ceil(TURBO_BLOCK);
    (blocks * TURBO_BLOCK * p.head_dim_qk, blocks * 4)
}

impl QuantParams {
    /// The parameters of `turbo_quant_q_*` (`quant_kv_body` with one tensor): the query blocks
    /// of `q` (`[batch, max_seqlen_q, heads_q, D]`, `seqlens_q` rows each) into `qq` / `qs`.
    pub(crate) fn for_q(p: &AttentionProblem, q: u64, seqlens_q: u64, qq: u64, qs: u64) -> Self {
        QuantParams {
            k: q,
            v: 0,
            lens: seqlens_q,
            kq: qq,
            vt: 0,
            ks: qs,
            vs: 0,
            cache: CacheParams::default(),
            batch: p.batch as i32,
            max_s: p.max_seqlen_q as i32,
            heads_kv: p.heads_q as i32,
            nblk: p.max_seqlen_q.div_ceil(TURBO_BLOCK) as i32,
            image: 1,
        }
    }
}

/// `struct DecodeParams` (turbo_decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct DecodeParams {
    q: u64,
    o: u64,
    lse: u64,
    lens: u64,
    q_tok: u64,
    seq_start: u64,
    cta_bounds: u64,
    cta_slot: u64,
    tile_slot: u64,
    part_o: u64,
    part_ml: u64,
    cache: CacheParams,
    batch: i32,
    max_sq: i32,
    heads_q: i32,
    heads_kv: i32,
    group: i32,
    qgroups: i32,
    num_ctas: i32,
    num_tiles: i32,
    sas: i32,
    sas_nr: i32,
    softmax_scale: f32,
}

/// `struct AppendParams` (turbo_decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AppendParams {
    k: u64,
    v: u64,
    src_tok: u64,
    lens: u64,
    cache: CacheParams,
    batch: i32,
    src_len: i32,
    heads_kv: i32,
}

/// `struct FlushParams` (turbo_decode.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlushParams {
    seqs: u64,
    blocks: u64,
    cache: CacheParams,
    count: i32,
    heads_kv: i32,
}

// ---- configuration -----------------------------------------------------------------------------

/// Checks that a configuration, dtype and head dim have kernels (the closed list in the module
/// docs); `Unsupported` names what is and what would be.
pub fn check_supported(cfg: &TurboConfig, dtype: DType, head_dim: usize) -> Result<()> {
    cfg.validate()?;
    if cfg.block_q != TURBO_BLOCK || cfg.block_k != TURBO_BLOCK || cfg.buffer_tokens != TURBO_BLOCK
    {
        return Err(CudaError::Unsupported {
            what: format!(
                "turbo blocks B_r = {}, B_c = {}, n_b = {} on CUDA",
                cfg.block_q, cfg.block_k, cfg.buffer_tokens
            ),
            supported: "B_r = B_c = n_b = 64 (the kernels' tile)".into(),
        });
    }
    kernels::turbo_kernel_names(dtype, head_dim)?;
    Ok(())
}

fn check_problem(cfg: &TurboConfig, p: &AttentionProblem) -> Result<()> {
    if p.head_dim_qk != p.head_dim_v {
        return Err(CudaError::Unsupported {
            what: format!(
                "turbo with head dims qk = {} and v = {}",
                p.head_dim_qk, p.head_dim_v
            ),
            supported: "equal Q/K and V head dims".into(),
        });
    }
    check_supported(cfg, p.dtype, p.head_dim_qk)
}

/// The two TurboAttention modules, loaded once per backend.
#[derive(Debug)]
pub struct TurboModules {
    prefill: Arc<Module>,
    decode: Arc<Module>,
}

/// The entry points of one (dtype, head dim) configuration.
#[derive(Clone, Debug)]
pub struct TurboKernels {
    quant_kv: Function,
    /// `turbo_quant_q_*`: the query blocks of `turbo_prefill_wgf_*` to INT8.
    quant_q: Function,
    buffer_tail: Function,
    prefill: Function,
    /// `turbo_prefill_wg_*`, or `turbo_prefill_wgf_*` with
    /// [`Options::fast_turbo_prefill`](crate::Options::fast_turbo_prefill) (same operands, its
    /// own launch shape), present on sm_90 (compute capability 9.0) only.
    prefill_wg: Option<(Function, WgShape)>,
    decode: Function,
    decode_g4: Function,
    /// The two decode instances under the fast contract, in the same order.
    decode_fast: Function,
    decode_g4_fast: Function,
    /// `decode_g4_fast` with the tile's format as branches (the same bits), chosen per launch by
    /// [`TurboKernels::decode_instance`].
    decode_g4_fast_mixed: Function,
    /// [`Options::turbo_decode_branches`](crate::Options::turbo_decode_branches).
    branches_forced: Option<bool>,
    /// The device's DRAM bandwidth per SM, if known (for [`decode_branches_policy`]).
    dram_per_sm: Option<u64>,
    /// [`Options::turbo_decode_full_rows`](crate::Options::turbo_decode_full_rows).
    full_rows_only: bool,
    /// The fast-contract instances ([`CudaBackend::turbo_decode_is_fast`]).
    fast: bool,
    combine: Function,
    /// Programmatic launch of the combine is available: compute capability 9.0 or newer.
    combine_pdl_ok: bool,
    /// `FERRATTN_TURBO_COMBINE_PDL=1` / `=0` (read when the kernels are chosen): the combine
    /// under PDL after every decode / after none; unset, [`combine_pdl_policy`] decides.
    combine_pdl_forced: Option<bool>,
    append: Function,
    flush: Function,
}

/// Whether the combine after a decode launch of `grid_ctas` CTAs over a cache whose KV heads
/// hold `bits` is launched with programmatic stream serialization ([`launch_programmatic`]),
/// so that its launch and SAS table overlap the decode's tail. Chosen by what was measured on
/// an H200 (issue 11, docs/TURBO_CUDA.md "Decode: the tile's format as branches, and the
/// combine under PDL where it pays"): on where the cache holds a 2-bit head (0.1-3% faster at
/// every mixed shape timed, two sessions) or the decode grid leaves an SM free (`grid_ctas <
/// sms`: batch 1 at 16k, 1.4-3.3% faster with INT4 too); off for an all-4-bit cache that fills
/// the GPU, where it was 0.9-1.5% slower at 16 x 16k in two sessions (decode8, decode13).
pub(crate) fn combine_pdl_policy(bits: &[u8], grid_ctas: usize, sms: usize) -> bool {
    grid_ctas < sms || bits.contains(&2)
}

/// Whether a decode launch of `grid_ctas` CTAs over a cache whose KV heads hold `bits` runs
/// `turbo_decode_g4_fast_mixed_*` (the tile's format tested as branches, folded tiles first,
/// the parameter copies predicated) instead of `turbo_decode_g4_fast_*` (a switch on one
/// variant number); both give the same bits. Chosen by what was measured on an H200 (issue 11,
/// docs/TURBO_CUDA.md, decode13 and "Decode: the branch-dispatch instance for the mixed
/// cache"): with a 2-bit head and a grid that fills the GPU the branches were 1.2-2.4% faster
/// at every mixed shape of 1 GB in decode13 and 1.7-2.8% (medians of eight runs, two calls) in
/// decode14; an all-4-bit cache moved by -0.6..+0.5% and batch 1 at 16k (128 CTAs) by +0.7% in
/// decode13, so those keep the switch instance. On an H100 (25 GB/s of DRAM bandwidth per SM; lead,
/// 2026-11-27, three interleaved runs, `docs/results/h100-2026-11-27-v17-turbo-decode/`) the branches
/// were 1.3% faster at mixed 8 x 32k but 1.1% slower at 16 x 16k and 1.4% at 32 x 32k (64 x 4k
/// flat), so they run only where the chip's DRAM bandwidth per SM exceeds
/// [`DECODE_BRANCHES_MIN_DRAM_PER_SM`] (the H200's 36 GB/s), never where it is unknown.
pub(crate) fn decode_branches_policy(
    bits: &[u8],
    grid_ctas: usize,
    sms: usize,
    dram_per_sm: Option<u64>,
) -> bool {
    grid_ctas >= sms
        && bits.contains(&2)
        && dram_per_sm.is_some_and(|b| b > DECODE_BRANCHES_MIN_DRAM_PER_SM)
}

/// DRAM bandwidth per SM (bytes per second) above which [`decode_branches_policy`] takes the
/// branch-dispatch instance: between the H100 SXM's 25 GB/s (mixed, 1 GB: -1.3..+1.4%) and the
/// H200's 36 GB/s (1.7-2.8% faster at every mixed shape of 1 GB).
pub(crate) const DECODE_BRANCHES_MIN_DRAM_PER_SM: u64 = 30_000_000_000;

impl TurboKernels {
    /// Whether the combine of this decode launch waits for it under PDL: on sm_90 only, then
    /// `FERRATTN_TURBO_COMBINE_PDL` if set, else [`combine_pdl_policy`].
    pub(crate) fn combine_pdl_for(&self, bits: &[u8], grid_ctas: usize, sms: usize) -> bool {
        self.combine_pdl_ok
            && self
                .combine_pdl_forced
                .unwrap_or_else(|| combine_pdl_policy(bits, grid_ctas, sms))
    }

    /// Whether groups of `group` query heads run a g4 instance (up to [`DECODE_G4_MAX_GROUP`],
    /// unless [`Options::turbo_decode_full_rows`](crate::Options::turbo_decode_full_rows)).
    fn takes_g4(&self, group: usize) -> bool {
        group <= DECODE_G4_MAX_GROUP && !self.full_rows_only
    }

    /// The decode instance for GQA groups of `group` query heads: `turbo_decode_g4_*` up to
    /// [`DECODE_G4_MAX_GROUP`], else `turbo_decode_*`; their `_fast_` twins where
    /// [`CudaBackend::turbo_decode_is_fast`] (the default on sm_90).
    pub fn decode_for(&self, group: usize) -> &Function {
        match (self.takes_g4(group), self.fast) {
            (true, false) => &self.decode_g4,
            (true, true) => &self.decode_g4_fast,
            (false, false) => &self.decode,
            (false, true) => &self.decode_fast,
        }
    }

    /// The decode instance of one launch: [`TurboKernels::decode_for`], with
    /// `turbo_decode_g4_fast_mixed_*` in place of `turbo_decode_g4_fast_*` where
    /// [`Options::turbo_decode_branches`](crate::Options::turbo_decode_branches) forces it or,
    /// unset, [`decode_branches_policy`] picks it for the cache's `bits` and the launch's grid.
    pub fn decode_instance(
        &self,
        group: usize,
        bits: &[u8],
        grid_ctas: usize,
        sms: usize,
    ) -> &Function {
        let g4_fast = self.takes_g4(group) && self.fast;
        let branches = self
            .branches_forced
            .unwrap_or_else(|| decode_branches_policy(bits, grid_ctas, sms, self.dram_per_sm));
        if g4_fast && branches {
            &self.decode_g4_fast_mixed
        } else {
            self.decode_for(group)
        }
    }
}

// ---- the device cache --------------------------------------------------------------------------

/// Byte offset of each KV head's packed codes inside one sequence, and the bytes of codes per
/// sequence, for blocks of [`TURBO_BLOCK`] tokens (heads may differ in bits: section 3.2).
pub fn code_layout(head_dim: usize, bits: &[u8], capacity_blocks: usize) -> (Vec<u64>, u64) {
    let mut off = Vec::with_capacity(bits.len());
    let mut at = 0u64;
    for &b in bits {
        off.push(at);
        at += (capacity_blocks * TURBO_BLOCK * head_dim * b as usize / 8) as u64;
    }
    (off, at)
}

/// A tensor's arrays copied to the host: codes, channel parameters, block scales, buffer codes,
/// universal scales.
type HostArrays = (Vec<u8>, Vec<u8>, Vec<f32>, Vec<u8>, Vec<f32>);

#[derive(Debug)]
struct TensorArrays {
    codes: DeviceBuffer,
    par: DeviceBuffer,
    bscale: DeviceBuffer,
    buf: DeviceBuffer,
    buf_scale: DeviceBuffer,
    /// Per block: 1 when some code dequantizes past 127 (`CacheView::clamp` of
    /// turbo_common.cuh); written with the block, read by the decode to pick its exact path.
    clamp: DeviceBuffer,
}

impl TensorArrays {
    fn alloc(
        gpu: &Arc<Gpu>,
        batch: usize,
        hk: usize,
        d: usize,
        cap: usize,
        seq_code_bytes: u64,
    ) -> Result<TensorArrays> {
        Ok(TensorArrays {
            codes: DeviceBuffer::alloc(gpu, batch * seq_code_bytes as usize)?,
            par: DeviceBuffer::alloc(gpu, batch * hk * cap * 2 * d)?,
            bscale: DeviceBuffer::alloc(gpu, batch * hk * cap * 4)?,
            buf: DeviceBuffer::alloc(gpu, batch * hk * TURBO_BLOCK * d)?,
            // 0 = no universal scale yet (section 3.3): must start zeroed
            buf_scale: DeviceBuffer::from_slice(gpu, &vec![0f32; batch * hk])?,
            clamp: DeviceBuffer::alloc(gpu, batch * hk * cap * 4)?,
        })
    }

    fn view(&self) -> CacheView {
        CacheView {
            codes: self.codes.ptr(),
            par: self.par.ptr(),
            bscale: self.bscale.ptr(),
            buf: self.buf.ptr(),
            buf_scale: self.buf_scale.ptr(),
            clamp: self.clamp.ptr(),
        }
    }
}

/// The TurboAttention KV cache of a batch in device memory (layout: `turbo_common.cuh`):
/// per (sequence, KV head) and for K and V, compressed blocks of 64 tokens at the head's bit
/// width and the INT8 buffer of the tokens after the last block.
#[derive(Debug)]
pub struct DeviceTurboCache {
    /// Channels per K/V row.
    pub head_dim: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Bits of each KV head's blocks (2 or 4).
    pub bits: Vec<u8>,
    /// Compressed blocks each (sequence, head) can hold.
    pub capacity_blocks: usize,
    lens: Vec<usize>,
    seq_code_bytes: u64,
    k: TensorArrays,
    v: TensorArrays,
    head_bits: DeviceBuffer,
    head_off: DeviceBuffer,
}

impl DeviceTurboCache {
    /// An empty cache for `batch` sequences of up to `capacity_tokens` tokens each.
    pub fn alloc(
        gpu: &Arc<Gpu>,
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        bits: Vec<u8>,
        capacity_tokens: usize,
    ) -> Result<DeviceTurboCache> {
        if bits.len() != heads_kv || bits.iter().any(|&b| b != 2 && b != 4) {
            return Err(CudaError::Unsupported {
                what: format!("turbo cache bits {bits:?} for {heads_kv} KV heads"),
                supported: "one width per KV head, each 2 or 4".into(),
            });
        }
        let cap = capacity_tokens / TURBO_BLOCK;
        let (off, seq_code_bytes) = code_layout(head_dim, &bits, cap);
        let head_bits: Vec<i32> = bits.iter().map(|&b| b as i32).collect();
        Ok(DeviceTurboCache {
            head_dim,
            heads_kv,
            capacity_blocks: cap,
            lens: vec![0; batch],
            seq_code_bytes,
            k: TensorArrays::alloc(gpu, batch, heads_kv, head_dim, cap, seq_code_bytes)?,
            v: TensorArrays::alloc(gpu, batch, heads_kv, head_dim, cap, seq_code_bytes)?,
            head_bits: DeviceBuffer::from_slice(gpu, &head_bits)?,
            head_off: DeviceBuffer::from_slice(gpu, &off)?,
            bits,
        })
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.lens.len()
    }

    /// Tokens held per sequence.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Tokens one sequence can hold: the blocks plus a buffer one short of a block.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity_blocks * TURBO_BLOCK + TURBO_BLOCK - 1
    }

    /// Empties the cache (every sequence back to 0 tokens, no universal scale), asynchronously
    /// on the stream.
    pub fn reset(&mut self) -> Result<()> {
        self.k.buf_scale.fill_u32(0)?;
        self.v.buf_scale.fill_u32(0)?;
        self.lens.iter_mut().for_each(|l| *l = 0);
        Ok(())
    }

    pub(crate) fn params(&self) -> CacheParams {
        CacheParams {
            k: self.k.view(),
            v: self.v.view(),
            head_bits: self.head_bits.ptr(),
            head_off: self.head_off.ptr(),
            seq_code_bytes: self.seq_code_bytes,
            cap_blocks: self.capacity_blocks as i32,
            heads_kv: self.heads_kv as i32,
        }
    }

    /// Memory held, counted as [`TurboKvCache::memory`] counts it (packed codes, channel
    /// parameters, block scales, buffered INT8 codes and universal scales).
    pub fn memory(&self) -> CacheMemory {
        let d = self.head_dim;
        let (mut compressed, mut buffer, mut tokens) = (0usize, 0usize, 0usize);
        for &len in &self.lens {
            tokens += len;
            for &b in &self.bits {
                compressed += 2 * (len / TURBO_BLOCK) * packed_block_bytes(TURBO_BLOCK, d, b);
                buffer += 2 * ((len % TURBO_BLOCK) * d + 4);
            }
        }
        CacheMemory::new(tokens, self.heads_kv, d, compressed, buffer)
    }

    /// Device memory allocated for the cache (its capacity, not its contents).
    pub fn allocated_bytes(&self) -> usize {
        [&self.k, &self.v]
            .iter()
            .map(|t| {
                t.codes.bytes()
                    + t.par.bytes()
                    + t.bscale.bytes()
                    + t.buf.bytes()
                    + t.buf_scale.bytes()
                    + t.clamp.bytes()
            })
            .sum()
    }

    /// Copies the cache to the host as the core's type, for bitwise comparison with the
    /// emulation (waits for the stream).
    pub fn download(&self) -> Result<TurboKvCache> {
        let (d, hk, cap) = (self.head_dim, self.heads_kv, self.capacity_blocks);
        let (off, _) = code_layout(d, &self.bits, cap);
        let get = |t: &TensorArrays| -> Result<HostArrays> {
            Ok((
                t.codes.to_vec()?,
                t.par.to_vec()?,
                t.bscale.to_vec()?,
                t.buf.to_vec()?,
                t.buf_scale.to_vec()?,
            ))
        };
        let arrays = [get(&self.k)?, get(&self.v)?];
        let tensor = |which: usize, b: usize, h: usize| -> TensorCache {
            let (codes, par, bscale, buf, buf_scale) = &arrays[which];
            let len = self.lens[b];
            let bits = self.bits[h];
            let cb = TURBO_BLOCK * d * bits as usize / 8;
            let bh = b * hk + h;
            let blocks = (0..len / TURBO_BLOCK)
                .map(|j| {
                    let pb = (bh * cap + j) * 2 * d;
                    let start = b * self.seq_code_bytes as usize + off[h] as usize + j * cb;
                    PackedBlock {
                        tokens: TURBO_BLOCK,
                        bits,
                        int8_scale: bscale[bh * cap + j],
                        channels: (0..d)
                            .map(|c| ChannelParams {
                                scale: par[pb + c],
                                zero: par[pb + d + c] as i8,
                            })
                            .collect(),
                        packed: codes[start..start + cb].to_vec(),
                    }
                })
                .collect();
            let tokens = len % TURBO_BLOCK;
            let s = buf_scale[bh];
            let start = bh * TURBO_BLOCK * d;
            TensorCache {
                blocks,
                buffer: Int8Buffer {
                    scale: (s > 0.0).then_some(s),
                    tokens,
                    codes: buf[start..start + tokens * d]
                        .iter()
                        .map(|&x| x as i8)
                        .collect(),
                },
            }
        };
        Ok(TurboKvCache {
            head_dim: d,
            heads_kv: hk,
            block_tokens: TURBO_BLOCK,
            bits: self.bits.clone(),
            seqs: (0..self.batch())
                .map(|b| SeqCache {
                    k: (0..hk).map(|h| tensor(0, b, h)).collect(),
                    v: (0..hk).map(|h| tensor(1, b, h)).collect(),
                })
                .collect(),
        })
    }
}

// ---- decode schedule: pure host code, in the core beside its CPU twin ---------------------------

pub use ferrattn_core::turbo::decode_plan::{
    decode_twin, decode_units, DecodeCosts, DecodePlan, DecodeSchedule, DECODE_COSTS,
    DECODE_ITERS_PER_UNIT, DECODE_MIN_ITERS_PER_UNIT,
};

/// Plans a decode launch ([`ferrattn_core::turbo::decode_plan::plan_decode`]). `lens[b]`: tokens
/// the cache holds for sequence `b`; `q_tok[b]`: the query token it decodes, or -1.
pub fn plan_decode(
    lens: &[usize],
    q_tok: &[i32],
    heads_q: usize,
    heads_kv: usize,
    schedule: DecodeSchedule,
) -> Result<DecodePlan> {
    Ok(ferrattn_core::turbo::decode_plan::plan_decode(
        lens, q_tok, heads_q, heads_kv, schedule,
    )?)
}

// ---- launches ----------------------------------------------------------------------------------

fn launch<P>(
    gpu: &Arc<Gpu>,
    f: &Function,
    grid: (usize, usize, usize),
    params: &mut P,
) -> Result<()> {
    launch_with(gpu, f, grid, TURBO_THREADS, 0, params)
}

/// [`launch`] with `smem` bytes of dynamic shared memory.
fn launch_smem<P>(
    gpu: &Arc<Gpu>,
    f: &Function,
    grid: (usize, usize, usize),
    smem: usize,
    params: &mut P,
) -> Result<()> {
    launch_with(gpu, f, grid, TURBO_THREADS, smem as u32, params)
}

fn launch_with<P>(
    gpu: &Arc<Gpu>,
    f: &Function,
    grid: (usize, usize, usize),
    threads: u32,
    smem_bytes: u32,
    params: &mut P,
) -> Result<()> {
    launch_on_stream(gpu, f, grid, threads, smem_bytes, gpu.stream, false, params)
}

/// Launches `f` with its single by-value parameter block on `stream` (the backend's own stream,
/// or a caller's for the device path in `device`); with `programmatic`, through
/// [`launch_programmatic`] (only `turbo_combine_*`, which reads nothing before
/// `griddepcontrol.wait` and writes nothing the decode reads; every `turbo_decode_*` signals
/// `griddepcontrol.launch_dependents` first thing). An empty grid launches nothing.
#[allow(clippy::too_many_arguments)]
fn launch_on_stream<P>(
    gpu: &Arc<Gpu>,
    f: &Function,
    grid: (usize, usize, usize),
    threads: u32,
    smem_bytes: u32,
    stream: sys::CUstream,
    programmatic: bool,
    params: &mut P,
) -> Result<()> {
    if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
        return Ok(());
    }
    if grid.1 > 65535 || grid.2 > 65535 || grid.0 > i32::MAX as usize {
        return Err(CudaError::Unsupported {
            what: format!("grid {grid:?} for {}", f.name),
            supported: "x < 2^31, y and z <= 65535".into(),
        });
    }
    let mut args = [params as *mut P as *mut std::ffi::c_void];
    if programmatic {
        let grid = [grid.0 as u32, grid.1 as u32, grid.2 as u32];
        // SAFETY: as below; the combine's wait is the contract of `launch_programmatic`.
        return unsafe {
            launch_programmatic(gpu, f, grid, threads, smem_bytes, stream, &mut args)
        };
    }
    let _bound = gpu.bind()?;
    // SAFETY: `params` is the #[repr(C)] mirror of the kernel's single by-value parameter; the
    // callers' (unsafe) entry points vouched for the addresses inside it and for the stream.
    // Raw `cuLaunchKernel`: cudarc's safe launch builder takes its own stream type, not a
    // caller's raw `CUstream`.
    check("cuLaunchKernel", unsafe {
        sys::cuLaunchKernel(
            f.f,
            grid.0 as u32,
            grid.1 as u32,
            grid.2 as u32,
            threads,
            1,
            1,
            smem_bytes,
            stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

fn to_bits16(dtype: DType, data: &[f32]) -> Vec<u16> {
    match dtype {
        DType::F16 => data.iter().map(|&x| f16::from_f32(x).to_bits()).collect(),
        _ => data.iter().map(|&x| bf16::from_f32(x).to_bits()).collect(),
    }
}

fn lens_i32(l: &[usize]) -> Vec<i32> {
    l.iter().map(|&x| x as i32).collect()
}

/// A prefill made ready for repeated launches: kernels chosen, INT8 K/V workspace allocated.
#[derive(Debug)]
pub struct PreparedTurboPrefill {
    /// The problem.
    pub problem: AttentionProblem,
    /// The configuration.
    pub cfg: TurboConfig,
    kernels: TurboKernels,
    /// Attention on `turbo_prefill_wg_*` (warpgroup MMA) rather than `turbo_prefill_*`.
    wgmma: bool,
    nblk: usize,
    kq: DeviceBuffer,
    vt: DeviceBuffer,
    ks: DeviceBuffer,
    vs: DeviceBuffer,
    /// The fast kernel chosen: the INT8 Q tiles and their scales (`turbo_quant_q_*`, launched
    /// with the attention).
    q_tiles: Option<(DeviceBuffer, DeviceBuffer)>,
    /// `FERRATTN_WGF_TRACE` set and the fast kernel chosen: [`TRACE_WORDS`] u64 per CTA of
    /// the attention grid, the last launch's (`wgf_trace_slot` of turbo_prefill.cu).
    trace: Option<DeviceBuffer>,
}

/// Words per CTA of the fast prefill's diagnostic trace (`kTraceWords` of turbo_prefill.cu):
/// globaltimer at entry, clock64 at entry, after the Q block, after the tile loop, after the
/// store (warpgroup 0), globaltimer then, the latest consumer's globaltimer after its store,
/// SM id | tiles << 32, clock64 once the producer starts its copies, and once warpgroup 0's
/// tile 0 has landed; words 10.. are the per-warpgroup timeline of a kernel compiled with
/// `FERRATTN_WGF_TIMELINE` (zero otherwise; the word list is at `kTraceWords`).
pub const TRACE_WORDS: usize = 64;

/// A decode launch made ready: the plan's tables and the partial buffers on the device.
#[derive(Debug)]
pub struct PreparedTurboDecode {
    /// The host plan.
    pub plan: DecodePlan,
    kernels: TurboKernels,
    table: DeviceBuffer,
    offsets: [u64; 6],
    part_o: DeviceBuffer,
    part_ml: DeviceBuffer,
}

impl CudaBackend {
    /// The TurboAttention modules, loaded (or NVRTC-compiled) at first use.
    pub fn turbo_modules(&self) -> Result<&Arc<TurboModules>> {
        let gpu = self.gpu()?;
        self.turbo
            .get_or_init(|| {
                let load = |name: &str| {
                    let img = kernels::image(name).expect("turbo images are embedded by build.rs");
                    Module::load(gpu, img, self.options.force_nvrtc).map_err(|e| e.to_string())
                };
                Ok(Arc::new(TurboModules {
                    prefill: load("turbo_prefill")?,
                    decode: load("turbo_decode")?,
                }))
            })
            .as_ref()
            .map_err(|e| CudaError::Unavailable {
                reason: format!("the turbo kernels could not be loaded: {e}"),
            })
    }

    /// The kernels of a (dtype, head dim) configuration.
    pub fn turbo_kernels(&self, dtype: DType, head_dim: usize) -> Result<TurboKernels> {
        let n = kernels::turbo_kernel_names(dtype, head_dim)?;
        let m = self.turbo_modules()?;
        Ok(TurboKernels {
            quant_kv: m.prefill.function(&n.quant_kv)?,
            quant_q: m.prefill.function(&n.quant_q)?,
            buffer_tail: m.prefill.function(&n.buffer_tail)?,
            prefill: m.prefill.function(&n.prefill)?,
            prefill_wg: if self.has_sm90a() {
                Some(if self.options.fast_turbo_prefill {
                    (m.prefill.function(&n.prefill_wgf)?, WGF_SHAPE)
                } else {
                    (m.prefill.function(&n.prefill_wg)?, WG_SHAPE)
                })
            } else {
                None
            },
            decode: m.decode.function(&n.decode)?,
            decode_g4: m.decode.function(&n.decode_g4)?,
            decode_fast: m.decode.function(&n.decode_fast)?,
            decode_g4_fast: m.decode.function(&n.decode_g4_fast)?,
            decode_g4_fast_mixed: m.decode.function(&n.decode_g4_fast_mixed)?,
            branches_forced: self.options.turbo_decode_branches,
            dram_per_sm: self.gpu()?.caps.dram_bytes_per_unit(),
            full_rows_only: self.options.turbo_decode_full_rows,
            fast: self.turbo_decode_is_fast(),
            combine: m.decode.function(&n.combine)?,
            combine_pdl_ok: self
                .gpu()?
                .caps
                .compute_capability
                .is_some_and(|cc| cc >= (9, 0)),
            combine_pdl_forced: match std::env::var("FERRATTN_TURBO_COMBINE_PDL").as_deref() {
                Ok("1") => Some(true),
                Ok("0") => Some(false),
                _ => None,
            },
            append: m.decode.function(&n.append)?,
            flush: m.decode.function(&n.flush)?,
        })
    }

    fn turbo_provenance(&self) -> Result<Provenance> {
        Ok(Provenance {
            backend: "cuda".into(),
            device: format!("{} (TurboAttention INT8 + SAS)", self.gpu()?.caps.name),
            simulated: None,
        })
    }

    /// Prepares a prefill of `p` (validated problem) for repeated launches.
    pub fn turbo_prepare_prefill(
        &self,
        cfg: &TurboConfig,
        p: &AttentionProblem,
    ) -> Result<PreparedTurboPrefill> {
        p.validate()?;
        check_problem(cfg, p)?;
        let gpu = self.gpu()?;
        let d = p.head_dim_qk;
        let nblk = p.max_seqlen_k.div_ceil(TURBO_BLOCK).max(1);
        let tiles = p.batch * p.heads_kv * nblk;
        let kernels = self.turbo_kernels(p.dtype, d)?;
        let wgmma = match (&kernels.prefill_wg, self.options.exact_turbo_prefill) {
            (Some((f, shape)), false) => {
                let _bound = gpu.bind()?;
                // SAFETY: a valid function handle; the size (at head dim 128: 89 KiB for wg, 153
                // KiB for wgf) is within the 227 KiB an sm_90 block may opt into.
                check("cuFuncSetAttribute", unsafe {
                    sys::cuFuncSetAttribute(
                        f.f,
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        shape.smem_bytes(d) as i32,
                    )
                })?;
                true
            }
            _ => false,
        };
        // a diagnostic, read once: the fast kernel's per-CTA timeline (docs/TURBO_CUDA.md)
        static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let traced = *TRACE.get_or_init(|| std::env::var_os("FERRATTN_WGF_TRACE").is_some());
        let trace = match &kernels.prefill_wg {
            Some((_, shape)) if wgmma && traced && self.options.fast_turbo_prefill => {
                let (g, _) =
                    shape.launch_grid(p.causal, p.max_seqlen_q, p.heads_q, p.heads_kv, p.batch);
                let mut t = DeviceBuffer::alloc(gpu, g.0 * g.1 * g.2 * TRACE_WORDS * 8)?;
                t.fill_u32(0)?;
                Some(t)
            }
            _ => None,
        };
        let q_tiles = if wgmma && self.options.fast_turbo_prefill {
            let (codes, scales) = q_tile_bytes(p);
            Some((
                DeviceBuffer::alloc(gpu, codes)?,
                DeviceBuffer::alloc(gpu, scales)?,
            ))
        } else {
            None
        };
        Ok(PreparedTurboPrefill {
            problem: p.clone(),
            cfg: cfg.clone(),
            kernels,
            wgmma,
            nblk,
            trace,
            q_tiles,
            kq: DeviceBuffer::alloc(gpu, tiles * TURBO_BLOCK * d)?,
            vt: DeviceBuffer::alloc(gpu, tiles * TURBO_BLOCK * d)?,
            ks: DeviceBuffer::alloc(gpu, tiles * 4)?,
            vs: DeviceBuffer::alloc(gpu, tiles * 4)?,
        })
    }

    /// An empty device cache for `batch` sequences.
    pub fn turbo_alloc_cache(
        &self,
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        bits: Vec<u8>,
        capacity_tokens: usize,
    ) -> Result<DeviceTurboCache> {
        DeviceTurboCache::alloc(
            self.gpu()?,
            batch,
            heads_kv,
            head_dim,
            bits,
            capacity_tokens,
        )
    }

    /// Enqueues BPQ stage 1 of `k`, `v` over `lens` tokens per sequence into the prepared
    /// workspace and, with a cache, stage 2 of the full blocks and the INT8 buffer of the tails.
    #[allow(clippy::too_many_arguments)] // the device pointers of one launch
    fn turbo_launch_quant(
        &self,
        prep: &PreparedTurboPrefill,
        k: u64,
        v: u64,
        max_s: usize,
        lens: u64,
        cache: Option<&DeviceTurboCache>,
        tiles: bool,
    ) -> Result<()> {
        let gpu = self.gpu()?;
        let p = &prep.problem;
        let mut qp = QuantParams {
            k,
            v,
            lens,
            kq: if tiles { prep.kq.ptr() } else { 0 },
            vt: if tiles { prep.vt.ptr() } else { 0 },
            ks: prep.ks.ptr(),
            vs: prep.vs.ptr(),
            cache: cache.map(DeviceTurboCache::params).unwrap_or_default(),
            batch: p.batch as i32,
            max_s: max_s as i32,
            heads_kv: p.heads_kv as i32,
            nblk: prep.nblk as i32,
            image: prep.wgmma as i32,
        };
        // K of block j in CTA 2 j, V in CTA 2 j + 1
        launch(
            gpu,
            &prep.kernels.quant_kv,
            (2 * prep.nblk, p.heads_kv, p.batch),
            &mut qp,
        )?;
        if cache.is_some() {
            launch(
                gpu,
                &prep.kernels.buffer_tail,
                (p.heads_kv, p.batch, 1),
                &mut qp,
            )?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)] // the device pointers of one launch
    fn turbo_launch_attention(
        &self,
        prep: &PreparedTurboPrefill,
        q: u64,
        seqlens_q: u64,
        seqlens_k: u64,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        let p = &prep.problem;
        let mut pp = PrefillParams {
            q,
            o: out.o.ptr(),
            lse: out.lse.ptr(),
            seqlens_q,
            seqlens_k,
            kq: prep.kq.ptr(),
            vt: prep.vt.ptr(),
            ks: prep.ks.ptr(),
            vs: prep.vs.ptr(),
            batch: p.batch as i32,
            max_sq: p.max_seqlen_q as i32,
            heads_q: p.heads_q as i32,
            heads_kv: p.heads_kv as i32,
            group: p.group_size() as i32,
            nblk: prep.nblk as i32,
            causal: p.causal as i32,
            sas: prep.cfg.sas as i32,
            sas_nr: prep.cfg.sas_threshold,
            softmax_scale: p.softmax_scale,
            order: 0,
            trace: prep.trace.as_ref().map_or(0, |t| t.ptr()),
            qq: 0,
            qs: 0,
        };
        let q_blocks = p.max_seqlen_q.div_ceil(TURBO_BLOCK);
        match (&prep.kernels.prefill_wg, prep.wgmma) {
            (Some((f, shape)), true) => {
                if let Some((qq, qs)) = &prep.q_tiles {
                    let mut qp = QuantParams::for_q(p, q, seqlens_q, qq.ptr(), qs.ptr());
                    launch(
                        self.gpu()?,
                        &prep.kernels.quant_q,
                        (q_blocks, p.heads_q, p.batch),
                        &mut qp,
                    )?;
                    pp.qq = qq.ptr();
                    pp.qs = qs.ptr();
                }
                let (grid, order) =
                    shape.launch_grid(p.causal, p.max_seqlen_q, p.heads_q, p.heads_kv, p.batch);
                pp.order = order;
                launch_with(
                    self.gpu()?,
                    f,
                    grid,
                    shape.threads,
                    shape.smem_bytes(p.head_dim_qk),
                    &mut pp,
                )
            }
            _ => launch(
                self.gpu()?,
                &prep.kernels.prefill,
                (q_blocks, p.heads_q, p.batch),
                &mut pp,
            ),
        }
    }

    /// Whether prefills on this backend run the mma.sync kernel whose O equals the emulation
    /// bit for bit (not sm_90, or [`crate::Options::exact_turbo_prefill`]).
    pub fn turbo_prefill_is_exact(&self) -> bool {
        self.options.exact_turbo_prefill || !self.has_sm90a()
    }

    /// Whether decodes on this backend run the fast-contract instances (`turbo_decode_fast_*`,
    /// `turbo_decode_g4_fast_*`): the default on sm_90 and with
    /// [`crate::Options::fast_turbo_decode`], never with [`crate::Options::exact_turbo_decode`]
    /// (then the bit-exact instances, O equal to the emulation or its stream-K twin bit for
    /// bit).
    pub fn turbo_decode_is_fast(&self) -> bool {
        !self.options.exact_turbo_decode && (self.options.fast_turbo_decode || self.has_sm90a())
    }

    /// Compute capability 9.0: the fatbin's sm_90a code (wgmma, bulk copies) runs here.
    fn has_sm90a(&self) -> bool {
        self.gpu()
            .is_ok_and(|g| g.caps.compute_capability == Some((9, 0)))
    }

    /// Whether a prepared prefill runs the warpgroup-MMA kernel (sm_90, not
    /// [`crate::Options::exact_turbo_prefill`]); else the bit-exact mma.sync kernel.
    pub fn turbo_prefill_uses_wgmma(&self, prep: &PreparedTurboPrefill) -> bool {
        prep.wgmma
    }

    /// The fast prefill's per-CTA trace of the last attention launch ([`TRACE_WORDS`] words
    /// per CTA in the order of the linear block index), when `FERRATTN_WGF_TRACE` was set at
    /// the first prepare; a diagnostic (docs/TURBO_CUDA.md). Synchronizes.
    pub fn turbo_prefill_trace(&self, prep: &PreparedTurboPrefill) -> Result<Option<Vec<u64>>> {
        match &prep.trace {
            Some(t) => {
                self.gpu()?.synchronize()?;
                Ok(Some(t.to_vec::<u64>()?))
            }
            None => Ok(None),
        }
    }

    /// The INT8 Q tiles and block scales `turbo_quant_q_*` wrote at the last launch of `prep`
    /// (`(codes, scales)` in the layout of [`PrefillParams`]'s `qq` / `qs`; blocks without a
    /// row are not written), for the fast kernel only; a test hook. Synchronizes.
    pub fn turbo_prefill_q_tiles(
        &self,
        prep: &PreparedTurboPrefill,
    ) -> Result<Option<(Vec<i8>, Vec<f32>)>> {
        match &prep.q_tiles {
            Some((q, s)) => {
                self.gpu()?.synchronize()?;
                Ok(Some((q.to_vec::<i8>()?, s.to_vec::<f32>()?)))
            }
            None => Ok(None),
        }
    }

    /// Whether a prepared prefill runs the fast-contract kernel `turbo_prefill_wgf_*`
    /// ([`crate::Options::fast_turbo_prefill`] on sm_90): its twin is
    /// `ferrattn_core::turbo::prefill_fixed_p`, not the emulation.
    pub fn turbo_prefill_uses_fast(&self, prep: &PreparedTurboPrefill) -> bool {
        prep.wgmma && self.options.fast_turbo_prefill
    }

    /// Enqueues a whole prefill of device inputs: quantization (and the cache of every token
    /// when `cache` is given; it must be empty and hold `seqlens_k`), then attention into `out`.
    pub fn turbo_launch_prefill(
        &self,
        prep: &PreparedTurboPrefill,
        x: &DeviceInputs,
        out: &mut DeviceOutputs,
        cache: Option<&mut DeviceTurboCache>,
    ) -> Result<()> {
        let p = &prep.problem;
        if x.problem != *p {
            return Err(CudaError::Plan(
                "inputs describe another problem than the prepared prefill".into(),
            ));
        }
        if let Some(c) = &cache {
            check_cache_fits(c, p.batch, p.heads_kv, p.head_dim_qk)?;
            if c.lens.iter().any(|&l| l != 0) {
                return Err(CudaError::Plan("prefill needs an empty cache".into()));
            }
            if let Some(&l) = p.seqlens_k.iter().find(|&&l| l > c.capacity_tokens()) {
                return Err(CudaError::Plan(format!(
                    "a sequence of {l} tokens exceeds the cache's {} per sequence",
                    c.capacity_tokens()
                )));
            }
        }
        if self.options.poison_outputs {
            out.poison()?;
        }
        self.turbo_launch_quant(
            prep,
            x.k.ptr(),
            x.v.ptr(),
            p.max_seqlen_k,
            x.seqlens_k.ptr(),
            cache.as_deref(),
            true,
        )?;
        self.turbo_launch_attention(prep, x.q.ptr(), x.seqlens_q.ptr(), x.seqlens_k.ptr(), out)?;
        if let Some(c) = cache {
            c.lens = p.seqlens_k.clone();
        }
        Ok(())
    }

    /// Enqueues the attention launch of a prefill alone, over the INT8 K/V tiles a previous
    /// [`CudaBackend::turbo_launch_prefill`] of the same inputs left in `prep`'s workspace
    /// (benchmarks: the quantization pre-pass measured apart).
    pub fn turbo_prefill_attention_only(
        &self,
        prep: &PreparedTurboPrefill,
        x: &DeviceInputs,
        out: &mut DeviceOutputs,
    ) -> Result<()> {
        if x.problem != prep.problem {
            return Err(CudaError::Plan(
                "inputs describe another problem than the prepared prefill".into(),
            ));
        }
        self.turbo_launch_attention(prep, x.q.ptr(), x.seqlens_q.ptr(), x.seqlens_k.ptr(), out)
    }

    /// Compresses the first `lens[b]` tokens of `x`'s K and V into the empty `cache` (BPQ
    /// stages 1 and 2, the tails into the INT8 buffer): the cache a prefill leaves, without its
    /// attention. Waits for the stream.
    pub fn turbo_compress(
        &self,
        prep: &PreparedTurboPrefill,
        x: &DeviceInputs,
        lens: &[usize],
        cache: &mut DeviceTurboCache,
    ) -> Result<()> {
        let p = &prep.problem;
        if x.problem != *p || lens.len() != p.batch || lens.iter().any(|&l| l > p.max_seqlen_k) {
            return Err(CudaError::Plan(format!(
                "lengths {lens:?} do not fit the prepared problem's K/V"
            )));
        }
        check_cache_fits(cache, p.batch, p.heads_kv, p.head_dim_qk)?;
        if cache.lens.iter().any(|&l| l != 0) || lens.iter().any(|&l| l > cache.capacity_tokens()) {
            return Err(CudaError::Plan(
                "compression needs an empty cache with room for every token".into(),
            ));
        }
        let lb = DeviceBuffer::from_slice(self.gpu()?, &lens_i32(lens))?;
        self.turbo_launch_quant(
            prep,
            x.k.ptr(),
            x.v.ptr(),
            p.max_seqlen_k,
            lb.ptr(),
            Some(cache),
            false,
        )?;
        self.gpu()?.synchronize()?;
        cache.lens = lens.to_vec();
        Ok(())
    }

    /// TurboAttention prefill (Alg. 1) of host inputs: O and LSE, and the device cache of all
    /// keys and values (per-head bits from `cfg.kv_bits` measured on this context; room for
    /// `reserve_tokens` more tokens per sequence). The counterpart of
    /// [`ferrattn_core::turbo::prefill`].
    pub fn turbo_prefill(
        &self,
        cfg: &TurboConfig,
        p: &AttentionProblem,
        x: &AttentionInputs,
        reserve_tokens: usize,
    ) -> Result<(AttentionOutput, DeviceTurboCache)> {
        turbo::check_inputs(cfg, p, x)?;
        let prep = self.turbo_prepare_prefill(cfg, p)?;
        let v = x.v.as_ref().expect("checked: separate K and V");
        let bits = resolve_bits(&cfg.kv_bits, &x.k, v, &p.seqlens_k)?;
        let mut cache = self.turbo_alloc_cache(
            p.batch,
            p.heads_kv,
            p.head_dim_qk,
            bits,
            p.max_seqlen_k + reserve_tokens,
        )?;
        let dx = DeviceInputs::upload(self.gpu()?, p, x)?;
        let mut out = DeviceOutputs::alloc(self.gpu()?, p)?;
        self.turbo_launch_prefill(&prep, &dx, &mut out, Some(&mut cache))?;
        let o = out.download(p, self.turbo_provenance()?)?;
        Ok((o, cache))
    }

    /// The schedule [`CudaBackend::turbo_decode`] uses for a decode of `heads_q` query heads
    /// over caches of `lens` tokens: [`decode_units`] of the resident units (warps).
    pub fn turbo_auto_schedule_for(
        &self,
        lens: &[usize],
        heads_q: usize,
        heads_kv: usize,
        dtype: DType,
        head_dim: usize,
    ) -> Result<DecodeSchedule> {
        let qgroups = (heads_q / heads_kv).div_ceil(DECODE_ROWS);
        let tiles = lens.len() * heads_kv * qgroups;
        let iters: u64 = lens
            .iter()
            .map(|&l| l.div_ceil(TURBO_BLOCK).max(1) as u64 * (heads_kv * qgroups) as u64)
            .sum();
        let resident = self.turbo_decode_resident_units(dtype, head_dim, heads_q / heads_kv)?;
        Ok(decode_units(resident, tiles, iters))
    }

    /// The decode kernel a launch of `grid_ctas` CTAs over a cache whose KV heads hold `bits`
    /// runs for GQA groups of `group` ([`TurboKernels::decode_instance`]): its `extern "C"`
    /// name, for tests and benchmarks to state which instance they measured.
    pub fn turbo_decode_instance_name(
        &self,
        dtype: DType,
        head_dim: usize,
        group: usize,
        bits: &[u8],
        grid_ctas: usize,
    ) -> Result<String> {
        let sms = self.gpu()?.caps.compute_units;
        let k = self.turbo_kernels(dtype, head_dim)?;
        Ok(k.decode_instance(group, bits, grid_ctas, sms).name.clone())
    }

    /// [`CudaBackend::turbo_auto_schedule_for`] knowing only the number of output tiles and the
    /// GQA group: one unit per tile when they fill the resident units, else the balanced
    /// stream-K cut over all of them.
    pub fn turbo_auto_schedule(
        &self,
        plan_tiles: usize,
        group: usize,
        dtype: DType,
        head_dim: usize,
    ) -> Result<DecodeSchedule> {
        let resident = self.turbo_decode_resident_units(dtype, head_dim, group)?;
        Ok(decode_units(resident, plan_tiles, u64::MAX))
    }

    /// Decode units (warps) of the instance for GQA groups of `group` that fit on the GPU at
    /// once (its register cap sets the CTAs per SM).
    fn turbo_decode_resident_units(
        &self,
        dtype: DType,
        head_dim: usize,
        group: usize,
    ) -> Result<usize> {
        let gpu = self.gpu()?;
        let sms = gpu.caps.compute_units;
        let kernels = self.turbo_decode_kernels(dtype, head_dim)?;
        let f = kernels.decode_for(group);
        let mut occ = 0i32;
        let _bound = gpu.bind()?;
        // SAFETY: out-parameter query on a loaded function.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut occ,
                f.f,
                TURBO_THREADS as i32,
                decode_smem_bytes(head_dim),
            )
        })?;
        Ok(sms * occ.max(1) as usize * DECODE_UNITS_PER_CTA)
    }

    /// The kernels of a configuration with the decode instances' dynamic shared memory allowed.
    pub(crate) fn turbo_decode_kernels(
        &self,
        dtype: DType,
        head_dim: usize,
    ) -> Result<TurboKernels> {
        let k = self.turbo_kernels(dtype, head_dim)?;
        let gpu = self.gpu()?;
        let _bound = gpu.bind()?;
        for f in [
            &k.decode,
            &k.decode_g4,
            &k.decode_fast,
            &k.decode_g4_fast,
            &k.decode_g4_fast_mixed,
        ] {
            // SAFETY: a loaded function; the size is below the device's opt-in maximum (227 KiB).
            check("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(
                    f.f,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    decode_smem_bytes(head_dim) as i32,
                )
            })?;
        }
        Ok(k)
    }

    /// Uploads a decode plan for `cache` and allocates its partial buffers.
    pub fn turbo_prepare_decode(
        &self,
        plan: DecodePlan,
        dtype: DType,
        cache: &DeviceTurboCache,
    ) -> Result<PreparedTurboDecode> {
        let gpu = self.gpu()?;
        let d = cache.head_dim;
        let mut table: Vec<u32> = Vec::new();
        let mut offsets = [0u64; 6];
        let parts: [Vec<u32>; 6] = [
            plan.lens.iter().map(|&l| l as u32).collect(),
            plan.q_tok.iter().map(|&t| t as u32).collect(),
            plan.space.seq_start.iter().map(|&s| s as u32).collect(),
            plan.cta_bounds.iter().map(|&s| s as u32).collect(),
            plan.cta_slot.clone(),
            plan.tile_slot.clone(),
        ];
        for (i, part) in parts.iter().enumerate() {
            offsets[i] = (table.len() * 4) as u64;
            table.extend_from_slice(part);
        }
        let slots = plan.slots().max(1);
        let kernels = self.turbo_decode_kernels(dtype, d)?;
        Ok(PreparedTurboDecode {
            kernels,
            table: DeviceBuffer::from_slice(gpu, &table)?,
            offsets,
            part_o: DeviceBuffer::alloc(gpu, slots * DECODE_ROWS * d * 4)?,
            part_ml: DeviceBuffer::alloc(gpu, slots * DECODE_ROWS * 2 * 4)?,
            plan,
        })
    }

    /// Enqueues a prepared decode of the queries of `q` (`[B, max_sq, Hq, D]`; sequence `b`
    /// decodes token `plan.q_tok[b]`) into `out` (same `max_sq`).
    pub fn turbo_launch_decode(
        &self,
        prep: &PreparedTurboDecode,
        cfg: &TurboConfig,
        cache: &DeviceTurboCache,
        q: &DeviceInputs,
        out: &mut DeviceOutputs,
        softmax_scale: f32,
    ) -> Result<()> {
        let qp = &q.problem;
        if qp.batch != cache.batch()
            || qp.heads_q != prep.plan.heads_q
            || qp.head_dim_qk != cache.head_dim
        {
            return Err(CudaError::Plan(
                "queries of another shape than the decode plan and cache".into(),
            ));
        }
        if self.options.poison_outputs {
            out.poison()?;
        }
        self.turbo_launch_decode_raw(
            prep,
            cfg,
            cache,
            q.q.ptr(),
            out,
            qp.max_seqlen_q,
            softmax_scale,
        )
    }

    #[allow(clippy::too_many_arguments)] // the device pointers of one launch
    fn turbo_launch_decode_raw(
        &self,
        prep: &PreparedTurboDecode,
        cfg: &TurboConfig,
        cache: &DeviceTurboCache,
        q: u64,
        out: &mut DeviceOutputs,
        max_sq: usize,
        softmax_scale: f32,
    ) -> Result<()> {
        let gpu = self.gpu()?;
        let pl = &prep.plan;
        let stale = pl.lens.len() != cache.batch()
            || (0..pl.lens.len()).any(|b| pl.q_tok[b] >= 0 && pl.lens[b] != cache.lens[b]);
        if stale {
            return Err(CudaError::Plan(format!(
                "decode plan made for cache lengths {:?}, the cache holds {:?}",
                pl.lens, cache.lens
            )));
        }
        let t = prep.table.ptr();
        let mut dp = DecodeParams {
            q,
            o: out.o.ptr(),
            lse: out.lse.ptr(),
            lens: t + prep.offsets[0],
            q_tok: t + prep.offsets[1],
            seq_start: t + prep.offsets[2],
            cta_bounds: t + prep.offsets[3],
            cta_slot: t + prep.offsets[4],
            tile_slot: t + prep.offsets[5],
            part_o: prep.part_o.ptr(),
            part_ml: prep.part_ml.ptr(),
            cache: cache.params(),
            batch: pl.lens.len() as i32,
            max_sq: max_sq as i32,
            heads_q: pl.heads_q as i32,
            heads_kv: pl.heads_kv as i32,
            group: (pl.heads_q / pl.heads_kv) as i32,
            qgroups: pl.qgroups as i32,
            num_ctas: pl.num_ctas() as i32,
            num_tiles: pl.num_tiles() as i32,
            sas: cfg.sas as i32,
            sas_nr: cfg.sas_threshold,
            softmax_scale,
        };
        launch_smem(
            gpu,
            prep.kernels.decode_instance(
                pl.heads_q / pl.heads_kv,
                &cache.bits,
                pl.grid_ctas(),
                gpu.caps.compute_units,
            ),
            (pl.grid_ctas(), 1, 1),
            decode_smem_bytes(cache.head_dim),
            &mut dp,
        )?;
        launch_on_stream(
            gpu,
            &prep.kernels.combine,
            (pl.num_tiles(), combine_rows(pl.heads_q, pl.heads_kv), 1),
            TURBO_COMBINE_THREADS,
            0,
            gpu.stream,
            prep.kernels
                .combine_pdl_for(&cache.bits, pl.grid_ctas(), gpu.caps.compute_units),
            &mut dp,
        )
    }

    /// Enqueues the append of token `src_tok[b]` of `k`, `v` (`[B, src_len, Hk, D]`, 16-bit) to
    /// every sequence with `src_tok[b] >= 0`, then flushes the buffers that became full. The
    /// returned buffers hold the launch tables and must live until the stream is synchronized.
    pub(crate) fn turbo_launch_append(
        &self,
        cache: &mut DeviceTurboCache,
        dtype: DType,
        k: u64,
        v: u64,
        src_len: usize,
        src_tok: &[i32],
    ) -> Result<Vec<DeviceBuffer>> {
        let gpu = self.gpu()?;
        let kern = self.turbo_kernels(dtype, cache.head_dim)?;
        // an internal invariant, not input: both callers (`turbo_append`, `turbo_decode`) build
        // `src_tok` with one entry per sequence of `cache`
        assert_eq!(
            src_tok.len(),
            cache.batch(),
            "one source token per sequence"
        );
        for (b, &t) in src_tok.iter().enumerate() {
            if t >= 0 && cache.lens[b] + 1 > cache.capacity_tokens() {
                return Err(CudaError::Plan(format!(
                    "sequence {b} is full ({} tokens)",
                    cache.lens[b]
                )));
            }
        }
        let mut table: Vec<i32> = src_tok.to_vec();
        table.extend(lens_i32(&cache.lens));
        let tb = DeviceBuffer::from_slice(gpu, &table)?;
        let batch = cache.batch();
        let mut ap = AppendParams {
            k,
            v,
            src_tok: tb.ptr(),
            lens: tb.ptr() + 4 * batch as u64,
            cache: cache.params(),
            batch: batch as i32,
            src_len: src_len as i32,
            heads_kv: cache.heads_kv as i32,
        };
        launch(gpu, &kern.append, (cache.heads_kv, batch, 1), &mut ap)?;
        let (mut seqs, mut blocks) = (Vec::new(), Vec::new());
        for (b, &t) in src_tok.iter().enumerate() {
            if t >= 0 {
                cache.lens[b] += 1;
                if cache.lens[b].is_multiple_of(TURBO_BLOCK) {
                    seqs.push(b as i32);
                    blocks.push((cache.lens[b] / TURBO_BLOCK - 1) as i32);
                }
            }
        }
        let mut keep = vec![tb];
        if !seqs.is_empty() {
            let n = seqs.len();
            seqs.extend(blocks);
            let fb = DeviceBuffer::from_slice(gpu, &seqs)?;
            let mut fp = FlushParams {
                seqs: fb.ptr(),
                blocks: fb.ptr() + 4 * n as u64,
                cache: cache.params(),
                count: n as i32,
                heads_kv: cache.heads_kv as i32,
            };
            launch(gpu, &kern.flush, (cache.heads_kv, n, 1), &mut fp)?;
            keep.push(fb);
        }
        Ok(keep)
    }

    /// Appends one token per sequence (`k_new`, `v_new`: `[B, 1, Hk, D]` host tensors in the
    /// query's dtype) and flushes full buffers: [`TurboKvCache::append`] on the device.
    pub fn turbo_append(
        &self,
        cache: &mut DeviceTurboCache,
        k_new: &Tensor,
        v_new: &Tensor,
    ) -> Result<()> {
        let want = [cache.batch(), 1, cache.heads_kv, cache.head_dim];
        for (name, x) in [("k_new", k_new), ("v_new", v_new)] {
            if x.shape != want {
                return Err(CudaError::Core(ferrattn_core::CoreError::Shape {
                    tensor: name,
                    actual: x.shape.clone(),
                    expected: format!(
                        "{want:?} (batch, one token, heads_kv, head_dim of the cache)"
                    ),
                }));
            }
            if let Some((index, value)) = x.first_non_finite() {
                return Err(CudaError::Core(ferrattn_core::CoreError::NonFinite {
                    tensor: name,
                    index,
                    value,
                }));
            }
        }
        let gpu = self.gpu()?;
        let dtype = k_new.dtype;
        let kb = DeviceBuffer::from_slice(gpu, &to_bits16(dtype, &k_new.data))?;
        let vb = DeviceBuffer::from_slice(gpu, &to_bits16(dtype, &v_new.data))?;
        let keep =
            self.turbo_launch_append(cache, dtype, kb.ptr(), vb.ptr(), 1, &vec![0; cache.batch()])?;
        gpu.synchronize()?;
        drop((keep, kb, vb));
        Ok(())
    }

    /// TurboAttention decode (Alg. 2) of one query token per sequence (`q`: `[B, 1, Hq, D]`)
    /// over everything `cache` holds, under `schedule` (`None`:
    /// [`CudaBackend::turbo_auto_schedule_for`]).
    /// The counterpart of [`ferrattn_core::turbo::decode`].
    pub fn turbo_decode(
        &self,
        cfg: &TurboConfig,
        cache: &DeviceTurboCache,
        q: &Tensor,
        softmax_scale: f32,
        schedule: Option<DecodeSchedule>,
    ) -> Result<AttentionOutput> {
        let (batch, hq, d) = check_decode_query(cache, q, softmax_scale)?;
        check_supported(cfg, q.dtype, d)?;
        let gpu = self.gpu()?;
        let p = AttentionProblem::uniform(batch, 1, 1, hq, cache.heads_kv, d, d, q.dtype);
        let q_tok = vec![0i32; batch];
        let schedule = match schedule {
            Some(s) => s,
            None => self.turbo_auto_schedule_for(&cache.lens, hq, cache.heads_kv, q.dtype, d)?,
        };
        let plan = plan_decode(&cache.lens, &q_tok, hq, cache.heads_kv, schedule)?;
        let prep = self.turbo_prepare_decode(plan, q.dtype, cache)?;
        let qb = DeviceBuffer::from_slice(gpu, &to_bits16(q.dtype, &q.data))?;
        let mut out = DeviceOutputs::alloc(gpu, &p)?;
        if self.options.poison_outputs {
            out.poison()?;
        }
        self.turbo_launch_decode_raw(&prep, cfg, cache, qb.ptr(), &mut out, 1, softmax_scale)?;
        out.download(&p, self.turbo_provenance()?)
    }

    /// One decode step: append `k_new`, `v_new` (`[B, 1, Hk, D]`), flushing full buffers, then
    /// decode `q`, which sees its own token ([`ferrattn_core::turbo::decode_step`]).
    #[allow(clippy::too_many_arguments)] // the step's tensors and its settings
    pub fn turbo_decode_step(
        &self,
        cfg: &TurboConfig,
        cache: &mut DeviceTurboCache,
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        softmax_scale: f32,
        schedule: Option<DecodeSchedule>,
    ) -> Result<AttentionOutput> {
        check_decode_query(cache, q, softmax_scale)?;
        check_supported(cfg, q.dtype, cache.head_dim)?;
        self.turbo_append(cache, k_new, v_new)?;
        self.turbo_decode(cfg, cache, q, softmax_scale, schedule)
    }

    /// [`ferrattn_core::turbo::emulate`]'s semantics on the GPU (see the module docs).
    pub fn turbo_run(
        &self,
        cfg: &TurboConfig,
        p: &AttentionProblem,
        x: &AttentionInputs,
        schedule: Option<DecodeSchedule>,
    ) -> Result<AttentionOutput> {
        turbo::check_inputs(cfg, p, x)?;
        check_problem(cfg, p)?;
        let gpu = self.gpu()?;
        let v = x.v.as_ref().expect("checked: separate K and V");
        let decode_seq: Vec<bool> = (0..p.batch)
            .map(|b| p.seqlens_q[b] < p.seqlens_k[b])
            .collect();
        let dx = DeviceInputs {
            problem: p.clone(),
            q: DeviceBuffer::from_slice(gpu, &to_bits16(p.dtype, &x.q.data))?,
            k: DeviceBuffer::from_slice(gpu, &to_bits16(p.dtype, &x.k.data))?,
            v: DeviceBuffer::from_slice(gpu, &to_bits16(p.dtype, &v.data))?,
            seqlens_q: DeviceBuffer::from_slice(gpu, &lens_i32(&p.seqlens_q))?,
            seqlens_k: DeviceBuffer::from_slice(gpu, &lens_i32(&p.seqlens_k))?,
        };
        let mut out = DeviceOutputs::alloc(gpu, p)?;
        if self.options.poison_outputs {
            out.poison()?;
        }
        // Alg. 1 for the prefill sequences; the decode sequences get no query rows here (O = 0,
        // LSE = -inf everywhere, their decoded rows are overwritten below)
        let prep = self.turbo_prepare_prefill(cfg, p)?;
        let masked = |l: &[usize]| -> Vec<i32> {
            l.iter()
                .zip(&decode_seq)
                .map(|(&x, &dec)| if dec { 0 } else { x as i32 })
                .collect()
        };
        let sq = DeviceBuffer::from_slice(gpu, &masked(&p.seqlens_q))?;
        let sk = DeviceBuffer::from_slice(gpu, &masked(&p.seqlens_k))?;
        self.turbo_launch_quant(
            &prep,
            dx.k.ptr(),
            dx.v.ptr(),
            p.max_seqlen_k,
            sk.ptr(),
            None,
            true,
        )?;
        self.turbo_launch_attention(&prep, dx.q.ptr(), sq.ptr(), sk.ptr(), &mut out)?;
        let mut keep = vec![sq, sk];
        if decode_seq.iter().any(|&d| d) {
            // the context of each decode sequence compressed as a prefill leaves it
            let ctx: Vec<usize> = (0..p.batch)
                .map(|b| {
                    if decode_seq[b] {
                        p.seqlens_k[b] - p.seqlens_q[b]
                    } else {
                        0
                    }
                })
                .collect();
            let bits = resolve_bits(&cfg.kv_bits, &x.k, v, &ctx)?;
            let mut cache =
                self.turbo_alloc_cache(p.batch, p.heads_kv, p.head_dim_qk, bits, p.max_seqlen_k)?;
            let ctx_dev = DeviceBuffer::from_slice(gpu, &lens_i32(&ctx))?;
            self.turbo_launch_quant(
                &prep,
                dx.k.ptr(),
                dx.v.ptr(),
                p.max_seqlen_k,
                ctx_dev.ptr(),
                Some(&cache),
                false,
            )?;
            keep.push(ctx_dev);
            cache.lens = ctx.clone();
            let steps = (0..p.batch)
                .filter(|&b| decode_seq[b])
                .map(|b| p.seqlens_q[b])
                .max()
                .unwrap_or(0);
            let tok = |i: usize, b: usize, offset: bool| -> i32 {
                if decode_seq[b] && i < p.seqlens_q[b] {
                    (i + if offset { ctx[b] } else { 0 }) as i32
                } else {
                    -1
                }
            };
            let (d, group) = (p.head_dim_qk, p.group_size());
            let tiles = p.batch * p.heads_kv * group.div_ceil(DECODE_ROWS);
            let schedule = match schedule {
                Some(s) => s,
                None => self.turbo_auto_schedule(tiles, group, p.dtype, d)?,
            };
            // token i of every decoding sequence into the cache
            let append = |cache: &mut DeviceTurboCache, i: usize| {
                let src: Vec<i32> = (0..p.batch).map(|b| tok(i, b, true)).collect();
                self.turbo_launch_append(
                    cache,
                    p.dtype,
                    dx.k.ptr(),
                    dx.v.ptr(),
                    p.max_seqlen_k,
                    &src,
                )
            };
            if !p.causal {
                // every query sees every key: the whole suffix goes in first
                for i in 0..steps {
                    keep.extend(append(&mut cache, i)?);
                }
            }
            for i in 0..steps {
                if p.causal {
                    keep.extend(append(&mut cache, i)?);
                }
                let q_tok: Vec<i32> = (0..p.batch).map(|b| tok(i, b, false)).collect();
                let plan = plan_decode(&cache.lens, &q_tok, p.heads_q, p.heads_kv, schedule)?;
                let prep_d = self.turbo_prepare_decode(plan, p.dtype, &cache)?;
                self.turbo_launch_decode_raw(
                    &prep_d,
                    cfg,
                    &cache,
                    dx.q.ptr(),
                    &mut out,
                    p.max_seqlen_q,
                    p.softmax_scale,
                )?;
                gpu.synchronize()?; // prep_d's tables and partials are freed at the end of the step
            }
        }
        let o = out.download(p, self.turbo_provenance()?)?;
        drop(keep);
        Ok(o)
    }
}

fn check_cache_fits(
    c: &DeviceTurboCache,
    batch: usize,
    heads_kv: usize,
    head_dim: usize,
) -> Result<()> {
    if c.batch() != batch || c.heads_kv != heads_kv || c.head_dim != head_dim {
        return Err(CudaError::Plan(format!(
            "cache of {} sequences x {} KV heads x dim {} given for {batch} x {heads_kv} x {head_dim}",
            c.batch(),
            c.heads_kv,
            c.head_dim
        )));
    }
    Ok(())
}

/// `[B, 1, Hq, D]` with `Hq` a positive multiple of the cache's KV heads, finite values, a finite
/// positive scale (the checks of [`ferrattn_core::turbo::decode`]).
fn check_decode_query(
    cache: &DeviceTurboCache,
    q: &Tensor,
    softmax_scale: f32,
) -> Result<(usize, usize, usize)> {
    let ok = q.shape.len() == 4
        && q.shape[0] == cache.batch()
        && q.shape[1] == 1
        && q.shape[2] > 0
        && q.shape[2].is_multiple_of(cache.heads_kv)
        && q.shape[3] == cache.head_dim;
    if !ok {
        return Err(CudaError::Core(ferrattn_core::CoreError::Shape {
            tensor: "q",
            actual: q.shape.clone(),
            expected: format!(
                "[{}, 1, heads_q, {}] with heads_q a positive multiple of the cache's {} KV heads",
                cache.batch(),
                cache.head_dim,
                cache.heads_kv
            ),
        }));
    }
    if !softmax_scale.is_finite() || softmax_scale <= 0.0 {
        return Err(CudaError::Core(ferrattn_core::CoreError::BadLength {
            what: "softmax_scale".into(),
            value: softmax_scale as i64,
            requirement: format!("finite and positive (got {softmax_scale})"),
        }));
    }
    if let Some((index, value)) = q.first_non_finite() {
        return Err(CudaError::Core(ferrattn_core::CoreError::NonFinite {
            tensor: "q",
            index,
            value,
        }));
    }
    Ok((q.shape[0], q.shape[2], q.shape[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The combine's PDL policy: on with a 2-bit head or a grid that leaves an SM free, off for
    /// an all-4-bit cache filling the GPU (the H200's 132 SMs: batch 1 at 16k is 128 CTAs, the
    /// 1 GB shapes 396).
    #[test]
    fn combine_pdl_where_it_measured_faster() {
        let int4 = [4u8; 8];
        let mixed = [4, 2, 4, 2, 4, 2, 4, 2];
        assert!(combine_pdl_policy(&int4, 128, 132));
        assert!(!combine_pdl_policy(&int4, 396, 132));
        assert!(!combine_pdl_policy(&int4, 132, 132));
        assert!(combine_pdl_policy(&mixed, 396, 132));
        assert!(combine_pdl_policy(&[2u8], 1, 132));
    }

    /// The branch-dispatch instance only where it measured faster: a cache with a 2-bit head
    /// on a grid that fills the GPU (the bench's 1 GB shapes: 396 CTAs on 132 SMs); an
    /// all-4-bit cache and batch 1 at 16k (128 CTAs) keep the switch instance.
    #[test]
    fn decode_branches_where_they_measured_faster() {
        let int4 = [4u8; 8];
        let mixed = [4, 2, 4, 2, 4, 2, 4, 2];
        let h200 = Some(4_800_000_000_000 / 132);
        let h100 = Some(3_350_000_000_000 / 132);
        assert!(decode_branches_policy(&mixed, 396, 132, h200));
        assert!(decode_branches_policy(&mixed, 132, 132, h200));
        assert!(!decode_branches_policy(&mixed, 128, 132, h200));
        assert!(!decode_branches_policy(&int4, 396, 132, h200));
        assert!(!decode_branches_policy(&int4, 128, 132, h200));
        assert!(decode_branches_policy(&[2u8], 396, 132, h200));
        // the H100 and a chip of unknown bandwidth keep the switch instance
        assert!(!decode_branches_policy(&mixed, 396, 132, h100));
        assert!(!decode_branches_policy(&mixed, 396, 132, None));
    }

    /// The fast prefill's INT8 Q workspace (`turbo_quant_q_*`): one 64 x D tile and one f32
    /// scale per (sequence, query head, 64-row block), in both prefill paths (the device
    /// path's step plan reserves it after the K/V tiles).
    #[test]
    fn q_tiles_take_one_block_per_query_block_and_head() {
        let p = AttentionProblem::uniform(4, 4096, 4096, 32, 8, 128, 128, DType::BF16);
        assert_eq!(q_tile_bytes(&p), (4 * 32 * 64 * 64 * 128, 4 * 32 * 64 * 4));
        let p = AttentionProblem::uniform(2, 65, 65, 8, 2, 64, 64, DType::F16);
        assert_eq!(q_tile_bytes(&p), (2 * 8 * 2 * 64 * 64, 2 * 8 * 2 * 4));
        let plan = device::TurboPrefillStepPlan::new(&TurboConfig::default(), &p).unwrap();
        let kv = 2 * (2 * 2 * 2 * 64 * 64) + 2 * (2 * 2 * 2 * 4);
        assert!(plan.workspace_bytes() >= kv + q_tile_bytes(&p).0 + q_tile_bytes(&p).1);
    }

    /// The fast prefill's grouped grid: at Llama's 32 / 8 heads and 4 x 4096, 86 CTAs per KV
    /// head (256 items of three) instead of 22 per query head, trip-major for causal; the
    /// items of a KV head, walked as `wgf_cta` and the kernel's `item` walk them, cover every
    /// (query block, query head) pair once, the last CTA's extra items past the list.
    #[test]
    fn wgf_grid_covers_every_query_block_of_the_group_once() {
        if std::env::var_os("FERRATTN_WGF_ORDER").is_some() {
            return; // the override would change the order under test
        }
        assert_eq!(WG_SHAPE.launch_grid(true, 4096, 32, 8, 4), ((22, 32, 4), 0));
        assert_eq!(
            WGF_SHAPE.launch_grid(false, 4096, 32, 8, 4),
            ((86, 8, 4), 0)
        );
        assert_eq!(WGF_SHAPE.launch_grid(true, 4096, 32, 8, 4), ((8, 4, 86), 1));
        for (sq, hq, hk) in [
            (4096, 32, 8),
            (65, 8, 2),
            (577, 4, 4),
            (129, 8, 1),
            (300, 6, 2),
        ] {
            let ((trips, _, _), _) = WGF_SHAPE.launch_grid(false, sq, hq, hk, 1);
            let (group, nqb) = (hq / hk, sq.div_ceil(TURBO_BLOCK));
            let mut seen = vec![0u32; group * nqb];
            for trip in 0..trips {
                let first = 3 * trip;
                let (qb0, hg0) = (first / group, first % group);
                for w in 0..3 {
                    let hg = hg0 + w;
                    let carry = (hg >= group) as usize + (hg >= 2 * group) as usize;
                    let (qb, hg) = (qb0 + carry, hg - carry * group);
                    if qb < nqb {
                        seen[qb * group + hg] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "sq {sq} hq {hq} hk {hk}: {seen:?}"
            );
        }
    }

    /// turbo_prefill.cu's pre-pass codes without a division (round 21, `int8_code_bits`): for a
    /// block of bf16 or f16 values with amax finite and s = amax / 119 normal, r = 1 / s, the
    /// low byte of RN(RN(q0 + RN(x - s q0) r) + 1.5 2^23), q0 = RN(x r), is quantize_int8(x, s)
    /// for every x with |x| <= amax. bf16: every amax, against every x whose quotient reaches
    /// 2^-12 of 119 and every 61st smaller one (0 in both); the blocks the kernel leaves to
    /// main's loop (s subnormal) are exactly the 1005 amax under 119 2^-126. f16: every f16 value
    /// and every f32 step of the check is a normal f32 well inside the range, so the steps
    /// commute with a joint power-of-two scaling of x and amax, which maps every pair onto one
    /// with amax in the top binade [2^15, 65504]: those amax against every x. (Run over every
    /// pair of both formats, 2.07e9 with both signs, in C: docs/results/turbo-prepass21-2026-11-27.)
    #[test]
    fn int8_code_bits_is_quantize_int8() {
        use ferrattn_core::turbo::quant::{quantize_int8, INT8_DIVISOR};
        let code = |x: f32, s: f32, r: f32| {
            let q0 = x * r;
            let q = (-s).mul_add(q0, x).mul_add(r, q0);
            (q + 12_582_912.0f32).to_bits() as u8 as i8
        };
        let check = |name: &str, amax: f32, xs: &mut dyn Iterator<Item = f32>| {
            let s = amax / INT8_DIVISOR;
            if s < f32::MIN_POSITIVE {
                // amax is finite and positive here, so s is never NaN
                return false;
            }
            let r = 1.0 / s;
            for x in xs {
                for x in [x, -x] {
                    let (got, want) = (code(x, s, r), quantize_int8(x, s));
                    assert_eq!(got, want, "{name}: x {x:e}, amax {amax:e}, s {s:e}");
                }
            }
            true
        };
        let bf16 = |b: u16| half::bf16::from_bits(b).to_f32();
        let mut slow = 0;
        for a in 1..0x7f80u16 {
            let amax = bf16(a);
            let mut xs = (0..=a)
                .filter(|&b| bf16(b) >= amax * (1.0 / 4096.0) || b % 61 == 0)
                .map(bf16);
            slow += !check("bf16", amax, &mut xs) as u32;
        }
        assert_eq!(slow, 1005, "bf16 blocks left to main's loop");
        let f16 = |b: u16| half::f16::from_bits(b).to_f32();
        for a in 0x7800..0x7c00u16 {
            assert!(check("f16", f16(a), &mut (0..=a).map(f16)));
        }
    }

    #[test]
    fn param_blocks_match_the_kernel_structs() {
        // CacheView: 6 pointers; CacheParams: 2 views, 3 x 8 bytes, 2 ints
        assert_eq!(std::mem::size_of::<CacheView>(), 48);
        assert_eq!(std::mem::size_of::<CacheParams>(), 128);
        // QuantParams: 7 pointers, cache, 5 ints, padded to 8
        assert_eq!(std::mem::size_of::<QuantParams>(), 7 * 8 + 128 + 20 + 4);
        // PrefillParams: 9 pointers, 10 ints, 1 float, 4 bytes of padding, 3 pointers
        assert_eq!(std::mem::size_of::<PrefillParams>(), 12 * 8 + 12 * 4);
        // DecodeParams: 11 pointers, cache, 10 ints, 1 float, padded to 8
        assert_eq!(std::mem::size_of::<DecodeParams>(), 11 * 8 + 128 + 44 + 4);
        // AppendParams: 4 pointers, cache, 3 ints, padded
        assert_eq!(std::mem::size_of::<AppendParams>(), 4 * 8 + 128 + 12 + 4);
        // FlushParams: 2 pointers, cache, 2 ints
        assert_eq!(std::mem::size_of::<FlushParams>(), 2 * 8 + 128 + 8);
    }
}
