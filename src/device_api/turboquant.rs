//! The TurboQuant compressed cache on the device path (Zandieh et al.; issue 10's kernels): the
//! same shape of API as the TurboAttention cache beside it.
//!
//! - [`TurboQuantCache`] is a device object (made by [`TurboQuantDevice::cache`], fields
//!   private): per (sequence, KV head) a contiguous run of compressed tokens (rotated
//!   Lloyd-Max key codes with the QJL signs of their residual, or MSE-only keys; value codes;
//!   f16 norms), at most [`TurboQuantCache::capacity_tokens`] per sequence. Its memory is
//!   allocated once, when it is made; [`TurboQuantCache::memory`] and
//!   [`TurboQuantCache::allocated_bytes`] account for it. Its appends are compressed by the
//!   kernels of [`TurboQuantCacheSpec::compression`]: bit-exact with the core's emulation
//!   ([`TurboQuantCompression::Exact`]) or on tensor cores within a stated contract
//!   ([`TurboQuantCompression::Fast`], the default, and [`TurboQuantCompression::Split`]).
//! - [`TurboQuantDecodePlan`] is a pure host value made once per step: the caches' lengths
//!   before it, the tokens each sequence appends (one per decode step, a whole prompt for a
//!   prefill, none), the stream-K width. Every layer of a
//!   model has its own cache holding the same lengths, so one plan serves them all.
//! - The plan lays the step out in one workspace ([`TurboQuantDecodePlan::workspace_bytes`]:
//!   the schedule and append tables, then the split decode's scratch, the query fragments and
//!   the partials) that the caller allocates once and owns ([`Workspace`]).
//!   [`TurboQuantDevice::begin_decode`] checks it (device, size, alignment: a typed
//!   [`ViewError`] with the sizes) and copies the step's tables into it with one
//!   stream-ordered host-to-device copy on the caller's [`Stream`]: no allocation, no
//!   synchronisation. Once per step, outside a graph capture.
//! - Per layer, [`TurboQuantDecodeStep::append`] and [`TurboQuantDecodeStep::run`] check every
//!   view at the boundary ([`ViewError`] with the values, before any GPU access) and then only
//!   launch on the caller's stream: no allocation, no host synchronisation, no host-device
//!   copy, so the layers of a step can be captured in one CUDA graph and replayed. The step
//!   holds the workspace's mutable borrow (its tables stay the step's while it lives) and
//!   dropping it waits for nothing: the caller keeps the workspace alive, and uses it for
//!   nothing else, until the step's launches (and the replays of graphs captured from them)
//!   are done, as with every workspace of the device path.
//!
//! Inputs are f16 (the kernels' closed list, `ferrattn_cuda::turboquant::check_supported`), head
//! dim 64 or 128, keys of 2-4 bits with QJL (`qjl_dim = head_dim`) or without, values of 2-4
//! bits. Values are not checked for NaN/Inf here (that would read device memory on the host).

use super::{check_view, Location, Stream, TensorView, ViewError, Workspace};
use crate::{FerrattnError, Result};
use ferrattn_core::turboquant::{CompressedKv, TurboQuantConfig};
use ferrattn_core::{AttentionProblem, DType, DeviceCaps};
use ferrattn_cuda::turboquant::CompressPath;
use ferrattn_cuda::turboquant::{
    self as tq, DeviceTurboQuantCache, PreparedTurboQuantStep, TurboQuantAppendTables,
    TurboQuantCuda, TurboQuantDecodeTables, TurboQuantStepPlan,
};
use ferrattn_cuda::CudaBackend;
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// Alignment of a TurboQuant step's workspace, bytes.
pub const TURBOQUANT_WORKSPACE_ALIGN: usize = tq::TURBOQUANT_WORKSPACE_ALIGN;

/// Head dimensions the TurboQuant kernels have instances for.
pub const TURBOQUANT_HEAD_DIMS: [usize; 2] = [64, 128];

/// Tokens per decode iteration: a cache's capacity is rounded up to a multiple of it.
pub const TURBOQUANT_TILE_TOKENS: usize = tq::TILE_K;

/// The attention problem of one decode over caches of `lens` tokens (one query token each).
fn decode_problem(shape: &TurboQuantShape, lens: &[usize]) -> AttentionProblem {
    let mut p = AttentionProblem::uniform(
        shape.batch,
        1,
        lens.iter().copied().max().unwrap_or(1).max(1),
        shape.heads_q,
        shape.heads_kv,
        shape.head_dim,
        shape.head_dim,
        DType::F16,
    );
    p.seqlens_k = lens.to_vec();
    p.softmax_scale = shape.scale();
    p
}

fn positive(what: &str, got: usize) -> std::result::Result<(), ViewError> {
    if got == 0 {
        return Err(ViewError::Length {
            what: what.into(),
            got,
            requirement: "positive".into(),
        });
    }
    Ok(())
}

/// Checks a configuration against the kernels' closed list for head dim `d` (host only).
fn check_config(cfg: &TurboQuantConfig, d: usize) -> Result<()> {
    let p = AttentionProblem::uniform(1, 1, 1, 1, 1, d, d, DType::F16);
    cfg.check(&p)?;
    tq::check_supported(cfg, &p)?;
    tq::kernel_names(cfg, &p)?;
    Ok(())
}

/// Shapes of a TurboQuant decode step (everything but the lengths). Q, K, V and O are f16.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TurboQuantShape {
    /// Sequences.
    pub batch: usize,
    /// Query heads.
    pub heads_q: usize,
    /// KV heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Head dimension of Q, K and V (64 or 128).
    pub head_dim: usize,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
}

impl TurboQuantShape {
    fn scale(&self) -> f32 {
        self.softmax_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    fn check(&self) -> std::result::Result<(), ViewError> {
        positive("batch", self.batch)?;
        positive("heads_kv", self.heads_kv)?;
        if self.heads_q == 0 || !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(ViewError::Length {
                what: "heads_q".into(),
                got: self.heads_q,
                requirement: format!("a positive multiple of heads_kv = {}", self.heads_kv),
            });
        }
        if !TURBOQUANT_HEAD_DIMS.contains(&self.head_dim) {
            return Err(ViewError::Length {
                what: "head_dim".into(),
                got: self.head_dim,
                requirement: format!("one of {TURBOQUANT_HEAD_DIMS:?} (the TurboQuant kernels)"),
            });
        }
        let s = self.scale();
        if !s.is_finite() || s <= 0.0 {
            return Err(ViewError::Length {
                what: format!("softmax_scale {s}"),
                got: 0,
                requirement: "finite and positive".into(),
            });
        }
        Ok(())
    }
}

/// Which kernels compress the tokens appended to a [`TurboQuantCache`] (the decode reads every
/// cache the same way). Each path's contract against the core's `TurboQuantCodec::compress`
/// (docs/TURBOQUANT_CUDA.md, "Compression on tensor cores"; the constants are
/// `ferrattn_cuda::turboquant`'s, checked by `ferrattn_cuda::turboquant::check_compress_contract`):
///
/// - [`Self::Exact`]: codes, QJL signs and norms equal the emulation's bit for bit (every f32 /
///   f64 step of the emulation as one IEEE instruction on CUDA cores). FP32-issue-bound: a
///   prefill compresses 8-95x slower than [`Self::Fast`], a one-token append costs 145 us at
///   batch 16 (H200, 26de7cc).
/// - [`Self::Fast`] (the default): the rotation `Π` (and for QJL keys `S Πᵀ`) as one f16 matrix
///   on tensor cores. Norms `‖x‖` bit-exact; a code may differ from the emulation's only where
///   the emulation's rotated coordinate lies within `FAST_CODE_MARGIN` (`2^-11 + 2^-14`) of a
///   Lloyd-Max boundary (a near tie: both centroids almost equally far); `‖r‖` within
///   `FAST_RNORM_REL` (`2^-10`) relative; a QJL sign may differ only where
///   `|(S r)_i| <= FAST_SIGN_MARGIN ‖S_i‖ ‖r‖` (`2^-9`). Measured: 0.7e-4 to 5.5e-4 of the codes
///   flip, and the decode over such a cache is as accurate against exact attention as over the
///   exact cache (error ratio geometric mean 1.003 over 21 cases, each within 10%).
/// - [`Self::Split`]: as [`Self::Fast`] with `Π` split into f16 hi + lo (about f32 accuracy):
///   codes differ only within `SPLIT_CODE_MARGIN` (`2^-14`) of a boundary (at most 1.4e-6 of
///   them measured); 5-53% slower than [`Self::Fast`].
///
/// Why [`Self::Fast`] is the default: a serving engine wants it. Its contract costs nothing in
/// decode accuracy (above), and it compresses a prompt 8-95x and appends a decode step's token
/// 7-31x faster than [`Self::Exact`] (145 -> 16 us per step at batch 16, 489 -> 17 us at batch
/// 64; H200, 26de7cc), which otherwise dominates a decode step over a short cache. Choose
/// [`Self::Exact`] to compare a cache with the CPU emulation bit for bit (tests, debugging),
/// [`Self::Split`] where a near-tie flip must be ~1e-6 rather than ~3e-4. Every path writes the
/// same layout, so a cache may change paths between appends (the tokens held keep their codes).
///
/// Serialised as `"exact"`, `"fast"`, `"split"`; [`std::str::FromStr`] reads the same names and
/// refuses anything else with the names it accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurboQuantCompression {
    /// Bit-exact with the emulation, on CUDA cores.
    Exact,
    /// Tensor cores, one f16 `Π`: exact norms, codes off only at near ties.
    #[default]
    Fast,
    /// Tensor cores, `Π` in f16 hi + lo: codes off only at the nearest ties.
    Split,
}

impl TurboQuantCompression {
    /// Every path, in the order of the docs.
    pub const ALL: [TurboQuantCompression; 3] = [
        TurboQuantCompression::Exact,
        TurboQuantCompression::Fast,
        TurboQuantCompression::Split,
    ];

    /// The name it is serialised and parsed as.
    pub fn name(self) -> &'static str {
        match self {
            TurboQuantCompression::Exact => "exact",
            TurboQuantCompression::Fast => "fast",
            TurboQuantCompression::Split => "split",
        }
    }

    /// The backend's kernels of this path.
    pub fn path(self) -> CompressPath {
        match self {
            TurboQuantCompression::Exact => CompressPath::Exact,
            TurboQuantCompression::Fast => CompressPath::Fast,
            TurboQuantCompression::Split => CompressPath::Split,
        }
    }
}

impl std::fmt::Display for TurboQuantCompression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name [`TurboQuantCompression`] does not know (its [`std::str::FromStr`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("TurboQuant compression {got:?}; the paths are \"exact\", \"fast\" and \"split\"")]
pub struct UnknownTurboQuantCompression {
    /// The name given.
    pub got: String,
}

impl std::str::FromStr for TurboQuantCompression {
    type Err = UnknownTurboQuantCompression;

    fn from_str(s: &str) -> std::result::Result<TurboQuantCompression, Self::Err> {
        TurboQuantCompression::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| UnknownTurboQuantCompression { got: s.into() })
    }
}

/// What a cache is made for: its batch, heads, configuration and per-sequence capacity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TurboQuantCacheSpec {
    /// Sequences.
    pub batch: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Head dimension (64 or 128).
    pub head_dim: usize,
    /// Tokens each sequence must be able to hold.
    pub capacity_tokens: usize,
    /// Bits, QJL, seed of the rotation and the sketch: a cache is decoded with the
    /// configuration that compressed it.
    pub config: TurboQuantConfig,
    /// The kernels that compress its appends ([`TurboQuantCompression`]: each path's contract,
    /// and why the default is [`TurboQuantCompression::Fast`]).
    pub compression: TurboQuantCompression,
}

impl TurboQuantCacheSpec {
    /// Checks the spec (host only): shapes as [`ViewError`]s, the configuration against the
    /// kernels' closed list (`Unsupported` with what is supported).
    pub fn validate(&self) -> Result<()> {
        TurboQuantShape {
            batch: self.batch,
            heads_q: self.heads_kv,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            softmax_scale: None,
        }
        .check()?;
        positive("capacity_tokens", self.capacity_tokens)?;
        super::check_cache_size(
            self.batch,
            self.heads_kv,
            self.head_dim,
            self.capacity_tokens,
        )?;
        check_config(&self.config, self.head_dim)
    }

    /// Tokens a cache made to this spec holds per sequence (`capacity_tokens` rounded up to
    /// whole [`TURBOQUANT_TILE_TOKENS`]); for a spec [`TurboQuantCacheSpec::validate`] refuses
    /// as too large, `capacity_tokens` itself.
    pub fn capacity(&self) -> usize {
        if self.capacity_tokens > i32::MAX as usize {
            return self.capacity_tokens; // rounding up could overflow
        }
        tq::cache_capacity(self.capacity_tokens)
    }

    /// Device bytes the cache will hold (its capacity, not its contents); `usize::MAX` for a
    /// spec too large for [`TurboQuantCacheSpec::validate`].
    pub fn allocated_bytes(&self) -> usize {
        if super::check_cache_size(
            self.batch,
            self.heads_kv,
            self.head_dim,
            self.capacity_tokens,
        )
        .is_err()
        {
            return usize::MAX;
        }
        tq::cache_bytes_for(
            &self.config,
            self.batch,
            self.heads_kv,
            self.head_dim,
            self.capacity_tokens,
        )
    }

    /// Checks that sequences of `lens` tokens fit a cache made to this spec (host only).
    pub fn check_lengths(&self, lens: &[usize]) -> std::result::Result<(), ViewError> {
        check_lengths(lens, self.batch, self.capacity())
    }
}

fn check_lengths(
    lens: &[usize],
    batch: usize,
    capacity: usize,
) -> std::result::Result<(), ViewError> {
    if lens.len() != batch {
        return Err(ViewError::Length {
            what: "the number of sequence lengths".into(),
            got: lens.len(),
            requirement: format!("one per sequence of the batch ({batch})"),
        });
    }
    super::check_capacity(lens, capacity)
}

/// Memory a TurboQuant cache's contents take, counted from the device layout.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TurboQuantMemory {
    /// Tokens held, summed over the sequences.
    pub tokens: usize,
    /// Bytes of the held tokens' codes, signs and norms (what a decode reads).
    pub compressed_bytes: usize,
    /// Bytes the same tokens take as fp16 K and V.
    pub fp16_bytes: usize,
    /// Compressed bytes per token (all KV heads, K and V).
    pub bytes_per_token: usize,
    /// `fp16_bytes / compressed_bytes` (0 when empty).
    pub compression_ratio: f64,
}

/// The TurboQuant compressed KV cache of one layer of a batch, in device memory it owns.
#[derive(Debug)]
pub struct TurboQuantCache {
    inner: DeviceTurboQuantCache,
    config: TurboQuantConfig,
    compression: TurboQuantCompression,
    ordinal: usize,
}

impl TurboQuantCache {
    /// Sequences.
    pub fn batch(&self) -> usize {
        self.inner.batch()
    }
    /// KV heads.
    pub fn heads_kv(&self) -> usize {
        self.inner.heads_kv()
    }
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.inner.head_dim()
    }
    /// The configuration that compresses (and must decode) the cache.
    pub fn config(&self) -> &TurboQuantConfig {
        &self.config
    }
    /// The kernels that compress the cache's appends.
    pub fn compression(&self) -> TurboQuantCompression {
        self.compression
    }
    /// Selects the kernels of the appends enqueued from now on (host only: the tokens held
    /// keep their codes, and the decode reads every path's the same way). An append captured
    /// in a CUDA graph keeps the kernels it was captured with.
    pub fn set_compression(&mut self, compression: TurboQuantCompression) {
        self.compression = compression;
    }
    /// Tokens held per sequence (counting appends enqueued and not yet run).
    pub fn lens(&self) -> &[usize] {
        self.inner.lens()
    }
    /// Tokens one sequence can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.inner.capacity()
    }
    /// Device of the cache.
    pub fn location(&self) -> Location {
        Location::Cuda(self.ordinal)
    }
    /// Memory the contents take.
    pub fn memory(&self) -> TurboQuantMemory {
        let tokens: usize = self.lens().iter().sum();
        let compressed_bytes = self.inner.bytes_read();
        let fp16_bytes = tokens * self.heads_kv() * 2 * self.head_dim() * 2;
        TurboQuantMemory {
            tokens,
            compressed_bytes,
            fp16_bytes,
            bytes_per_token: self.heads_kv() * self.inner.bytes_per_token_head(),
            compression_ratio: if compressed_bytes == 0 {
                0.0
            } else {
                fp16_bytes as f64 / compressed_bytes as f64
            },
        }
    }
    /// Device memory allocated for the cache (its capacity).
    pub fn allocated_bytes(&self) -> usize {
        self.inner.allocated_bytes()
    }
    /// Copies the cache to the host as the core's [`CompressedKv`] over its longest sequence
    /// (waits for the device; for tests and inspection, not for a step).
    pub fn download(&self) -> Result<CompressedKv> {
        let max = self.lens().iter().copied().max().unwrap_or(0).max(1);
        Ok(self.inner.download(max)?)
    }
    /// The backend's cache (for the host-buffer entry points of `ferrattn_cuda`).
    pub fn device_cache(&self) -> &DeviceTurboQuantCache {
        &self.inner
    }

    fn check_for(
        &self,
        plan: &TurboQuantDecodePlan,
        ordinal: usize,
    ) -> std::result::Result<(), ViewError> {
        if self.ordinal != ordinal {
            return Err(ViewError::Device {
                tensor: "cache",
                got: Location::Cuda(self.ordinal),
                expected: Location::Cuda(ordinal),
            });
        }
        let s = &plan.shape;
        let got = [self.batch(), self.heads_kv(), self.head_dim()];
        if got != [s.batch, s.heads_kv, s.head_dim] {
            return Err(ViewError::Shape {
                tensor: "cache",
                got: got.to_vec(),
                expected: vec![s.batch, s.heads_kv, s.head_dim],
                layout: "[batch, heads_kv, head_dim] of the cache",
            });
        }
        check_lengths(&plan.lens_after, s.batch, self.capacity_tokens())
    }

    fn check_lens(
        &self,
        what: &str,
        want: &[usize],
        alt: Option<&[usize]>,
    ) -> std::result::Result<(), ViewError> {
        let lens = self.lens();
        if lens == want || alt.is_some_and(|a| lens == a) {
            return Ok(());
        }
        let b = (0..lens.len()).find(|&b| lens[b] != want[b]).unwrap_or(0);
        Err(ViewError::Length {
            what: format!("tokens the cache holds for sequence {b}"),
            got: lens[b],
            requirement: format!("{what} planned for {} (all: {want:?})", want[b]),
        })
    }
}

/// The decode's stream-K schedule: its width in warps and the SMs of the device it is made for
/// (which pick how many merge CTAs share an output tile). From
/// [`TurboQuantDevice::decode_schedule`] (the backend's default width, from the decode
/// kernel's occupancy) or [`TurboQuantSchedule::stream_k`] (a width of the caller's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TurboQuantSchedule {
    units: usize,
    compute_units: usize,
}

impl TurboQuantSchedule {
    /// Stream-K over `units` warps on a device of `caps` (both positive).
    pub fn stream_k(units: usize, caps: &DeviceCaps) -> Result<TurboQuantSchedule> {
        positive("units (warps of the stream-K decode)", units)?;
        positive("compute units of the device", caps.compute_units)?;
        Ok(TurboQuantSchedule {
            units,
            compute_units: caps.compute_units,
        })
    }
    /// Warps the schedule splits the decode over (the plan may use fewer when the work has
    /// fewer 16-token iterations).
    pub fn units(&self) -> usize {
        self.units
    }
    /// SMs of the device the schedule is made for.
    pub fn compute_units(&self) -> usize {
        self.compute_units
    }
}

/// A decode step: the caches' lengths before it, the tokens each sequence appends, the
/// stream-K schedule, and the step's tables and workspace layout. Pure host data.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TurboQuantDecodePlan {
    shape: TurboQuantShape,
    config: TurboQuantConfig,
    lens_before: Vec<usize>,
    new_tokens: Vec<usize>,
    lens_after: Vec<usize>,
    schedule: TurboQuantSchedule,
    /// Bytes of the caller's workspace the step needs.
    workspace_bytes: usize,
    /// The tables (host images) and the workspace's regions.
    #[serde(skip)]
    step: TurboQuantStepPlan,
}

impl TurboQuantDecodePlan {
    /// Plans one decode step (one query token per sequence) over caches holding
    /// `lens_before[b]` tokens of sequence `b`; sequence `b` first appends `new_tokens[b]`
    /// tokens (1 in a decode step, its prompt in a prefill, 0 for none; the step's `k_new`,
    /// `v_new` are `[batch, max(new_tokens), heads_kv, head_dim]`, sequence `b` taking its
    /// first `new_tokens[b]` rows), which its query then sees. Every sequence must hold a
    /// token when the decode runs. `schedule`: the stream-K decode's width
    /// ([`TurboQuantDevice::decode_schedule`] for the backend's default).
    pub fn new(
        config: &TurboQuantConfig,
        shape: &TurboQuantShape,
        lens_before: &[usize],
        new_tokens: &[usize],
        schedule: TurboQuantSchedule,
    ) -> Result<TurboQuantDecodePlan> {
        shape.check()?;
        check_config(config, shape.head_dim)?;
        if lens_before.len() != shape.batch {
            return Err(ViewError::Length {
                what: "the number of sequence lengths".into(),
                got: lens_before.len(),
                requirement: format!("one per sequence of the batch ({})", shape.batch),
            }
            .into());
        }
        if new_tokens.len() != shape.batch {
            return Err(ViewError::Length {
                what: "the number of new-token counts".into(),
                got: new_tokens.len(),
                requirement: format!("one per sequence of the batch ({})", shape.batch),
            }
            .into());
        }
        let lens_after: Vec<usize> = lens_before
            .iter()
            .zip(new_tokens)
            .map(|(&l, &n)| l.saturating_add(n))
            .collect();
        if let Some(b) = lens_after.iter().position(|&l| l > i32::MAX as usize) {
            return Err(ViewError::Length {
                what: format!("tokens of sequence {b} after the step's append"),
                got: lens_after[b],
                requirement: format!("at most {} (the kernels' int32 tables)", i32::MAX),
            }
            .into());
        }
        if let Some(b) = lens_after.iter().position(|&l| l == 0) {
            return Err(ViewError::Length {
                what: format!("tokens of sequence {b} when the decode runs"),
                got: 0,
                requirement: "at least 1 (append the step's token, or prefill first)".into(),
            }
            .into());
        }
        positive("units (warps of the stream-K decode)", schedule.units)?;
        positive("compute units of the device", schedule.compute_units)?;
        let new_rows = new_tokens.iter().copied().max().unwrap_or(0);
        let append = if new_rows > 0 {
            // the capacity is the cache's, checked per layer against the cache itself
            Some(TurboQuantAppendTables::new(
                lens_before,
                new_tokens,
                new_rows,
                usize::MAX,
            )?)
        } else {
            None
        };
        let decode = TurboQuantDecodeTables::new(
            config,
            &decode_problem(shape, &lens_after),
            schedule.units,
            schedule.compute_units,
        )?;
        let step = TurboQuantStepPlan::new(Some(decode), append);
        Ok(TurboQuantDecodePlan {
            shape: *shape,
            config: config.clone(),
            lens_before: lens_before.to_vec(),
            new_tokens: new_tokens.to_vec(),
            lens_after,
            schedule,
            workspace_bytes: step.workspace_bytes(),
            step,
        })
    }

    /// Bytes of device memory the step needs in the caller's [`Workspace`]
    /// ([`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned): the schedule and append tables, the
    /// query fragments and the split decode's partials, reused by every layer in stream order.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }
    /// The stream-K schedule.
    pub fn schedule(&self) -> &TurboQuantSchedule {
        &self.schedule
    }
    /// Warps of the step's stream-K decode (at most the schedule's).
    pub fn units(&self) -> usize {
        self.step.decode().map_or(0, |d| d.units)
    }

    /// The shapes.
    pub fn shape(&self) -> &TurboQuantShape {
        &self.shape
    }
    /// The configuration the caches must have.
    pub fn config(&self) -> &TurboQuantConfig {
        &self.config
    }
    /// Tokens per sequence before the step.
    pub fn lens_before(&self) -> &[usize] {
        &self.lens_before
    }
    /// Tokens per sequence after the step's append (the lengths the decode sees).
    pub fn lens_after(&self) -> &[usize] {
        &self.lens_after
    }
    /// Tokens each sequence appends in the step.
    pub fn new_tokens(&self) -> &[usize] {
        &self.new_tokens
    }
    /// Rows of the step's `k_new` and `v_new` (the most tokens a sequence appends; 0: the
    /// step appends nothing).
    pub fn new_rows(&self) -> usize {
        self.new_tokens.iter().copied().max().unwrap_or(0)
    }
    /// The plan as JSON (to inspect or reproduce a step).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a plan serialises")
    }
}

/// The tensors of one layer's decode.
#[derive(Clone, Copy, Debug)]
pub struct TurboQuantDecodeViews<'v, 'a> {
    /// f16 `[batch, 1, heads_q, head_dim]`.
    pub q: &'v TensorView<'a>,
    /// Output, as `q`.
    pub o: &'v TensorView<'a>,
    /// Output `f32 [batch, heads_q, 1]`, natural log.
    pub lse: &'v TensorView<'a>,
}

/// The boundary check of one layer's decode views (host only).
pub fn validate_turboquant_decode(
    plan: &TurboQuantDecodePlan,
    x: &TurboQuantDecodeViews<'_, '_>,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let s = &plan.shape;
    let q = [s.batch, 1, s.heads_q, s.head_dim];
    const QL: &str = "[batch, 1, heads_q, head_dim], f16";
    check_view("q", x.q, &q, QL, DType::F16, location)?;
    check_view("o", x.o, &q, QL, DType::F16, location)?;
    check_view(
        "lse",
        x.lse,
        &[s.batch, s.heads_q, 1],
        "[batch, heads_q, 1], f32",
        DType::F32,
        location,
    )
}

/// The boundary check of one layer's appended token views (host only).
pub fn validate_turboquant_append(
    plan: &TurboQuantDecodePlan,
    k_new: &TensorView<'_>,
    v_new: &TensorView<'_>,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let s = &plan.shape;
    let kv = [s.batch, plan.new_rows(), s.heads_kv, s.head_dim];
    const KL: &str = "[batch, new_tokens, heads_kv, head_dim], f16";
    check_view("k_new", k_new, &kv, KL, DType::F16, location)?;
    check_view("v_new", v_new, &kv, KL, DType::F16, location)
}

/// TurboQuant on one CUDA device through caller-owned memory and streams.
#[derive(Debug)]
pub struct TurboQuantDevice {
    backend: CudaBackend,
    ordinal: usize,
    /// Kernels and tables per (configuration, head dim), loaded once.
    engines: Mutex<Vec<(TurboQuantConfig, usize, Arc<TurboQuantCuda>)>>,
}

impl TurboQuantDevice {
    /// TurboQuant on CUDA device `ordinal` (kernels load at first use of a configuration).
    pub fn new(ordinal: usize) -> Result<TurboQuantDevice> {
        let backend = CudaBackend::new(ordinal);
        backend.gpu()?;
        Ok(TurboQuantDevice {
            backend,
            ordinal,
            engines: Mutex::new(Vec::new()),
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// What the planner needs to know of the device.
    pub fn caps(&self) -> Result<DeviceCaps> {
        Ok(self.backend.gpu()?.caps.clone())
    }

    /// The backend (for its buffers, its stream and graph capture in tests).
    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }

    /// The kernels of `config` at head dim `d` (loaded once, then cached).
    pub fn engine(&self, config: &TurboQuantConfig, d: usize) -> Result<Arc<TurboQuantCuda>> {
        let mut list = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, e)) = list.iter().find(|(c, dd, _)| c == config && *dd == d) {
            return Ok(e.clone());
        }
        check_config(config, d)?;
        let p = AttentionProblem::uniform(1, 1, 1, 1, 1, d, d, DType::F16);
        let e = Arc::new(self.backend.turboquant(config, &p)?);
        list.push((config.clone(), d, e.clone()));
        Ok(e)
    }

    /// An empty cache made to `spec` (checked first). Allocates and zeroes its memory once and
    /// waits for the zeroing: make caches before a step, never inside one.
    pub fn cache(&self, spec: &TurboQuantCacheSpec) -> Result<TurboQuantCache> {
        spec.validate()?;
        let e = self.engine(&spec.config, spec.head_dim)?;
        let inner = e.alloc_cache(spec.batch, spec.heads_kv, spec.capacity_tokens)?;
        // the zeroing ran on the backend's stream; the caller's stream does not wait for it
        e.gpu().synchronize()?;
        Ok(TurboQuantCache {
            inner,
            config: spec.config.clone(),
            compression: spec.compression,
            ordinal: self.ordinal,
        })
    }

    /// Empties `cache` (host lengths to 0; the bytes stay and are masked by the lengths until
    /// overwritten). Nothing is enqueued.
    pub fn reset(&self, cache: &mut TurboQuantCache) {
        cache.inner.clear();
    }

    /// The backend's default stream-K schedule for a decode over caches of `lens_after`
    /// tokens (every resident warp the work can keep busy, from the decode kernel's occupancy
    /// on this device; host only once the configuration's kernels are loaded, which
    /// [`TurboQuantDevice::cache`] does).
    pub fn decode_schedule(
        &self,
        config: &TurboQuantConfig,
        shape: &TurboQuantShape,
        lens_after: &[usize],
    ) -> Result<TurboQuantSchedule> {
        shape.check()?;
        let engine = self.engine(config, shape.head_dim)?;
        let units = engine.default_units(&decode_problem(shape, lens_after));
        TurboQuantSchedule::stream_k(units, &engine.gpu().caps)
    }

    /// Starts a decode step: checks the workspace (device, at least
    /// [`TurboQuantDecodePlan::workspace_bytes`], [`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned)
    /// and enqueues the copy of the step's tables into it on `stream`: no allocation, no
    /// synchronisation. Once per step, outside a graph capture; the step is then launch-only.
    ///
    /// A CUDA graph captured from a step's launches reads the step's tables and scratch in the
    /// workspace: replay it while that step's tables are there (before another step begins in
    /// the same workspace). A replay does not move the caches' host lengths: the eager
    /// launches of a step do, and [`TurboQuantDecodeStep::append`] accepts a cache already at
    /// the step's lengths.
    pub fn begin_decode<'p, 'w>(
        &self,
        plan: &'p TurboQuantDecodePlan,
        workspace: &'w mut Workspace,
        stream: Stream,
    ) -> Result<TurboQuantDecodeStep<'p, 'w>> {
        validate_turboquant_workspace(plan, workspace, Location::Cuda(self.ordinal))?;
        let engine = self.engine(&plan.config, plan.shape.head_dim)?;
        // SAFETY: the workspace was checked (device, size, alignment) and the caller promised
        // it is device memory nothing else uses (Workspace::cuda); the stream by
        // Stream::from_raw; the plan's image lives in the plan, read before the call returns.
        let prepared =
            unsafe { engine.upload_step(&plan.step, workspace.addr, stream.as_raw() as _)? };
        Ok(TurboQuantDecodeStep {
            plan,
            engine,
            prepared,
            ordinal: self.ordinal,
            _workspace: PhantomData,
        })
    }
}

/// The boundary check of a step's workspace (host only): on `location`, at least
/// [`TurboQuantDecodePlan::workspace_bytes`] (else [`ViewError::Workspace`] with both sizes),
/// non-null and [`TURBOQUANT_WORKSPACE_ALIGN`]-byte aligned.
pub fn validate_turboquant_workspace(
    plan: &TurboQuantDecodePlan,
    w: &Workspace,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let needed = plan.workspace_bytes();
    if Location::Cuda(w.ordinal) != location {
        return Err(ViewError::Device {
            tensor: "workspace",
            got: Location::Cuda(w.ordinal),
            expected: location,
        });
    }
    if w.bytes < needed {
        return Err(ViewError::Workspace {
            needed,
            declared: w.bytes,
        });
    }
    if w.addr == 0 || !w.addr.is_multiple_of(TURBOQUANT_WORKSPACE_ALIGN as u64) {
        return Err(ViewError::Misaligned {
            tensor: "workspace",
            addr: w.addr,
            align: TURBOQUANT_WORKSPACE_ALIGN as u64,
        });
    }
    Ok(())
}

/// A decode step whose tables are in the caller's workspace: launches per layer. It holds the
/// workspace's mutable borrow, so the tables stay this step's while it lives; dropping it
/// waits for nothing.
#[derive(Debug)]
pub struct TurboQuantDecodeStep<'p, 'w> {
    plan: &'p TurboQuantDecodePlan,
    engine: Arc<TurboQuantCuda>,
    prepared: PreparedTurboQuantStep,
    ordinal: usize,
    _workspace: PhantomData<&'w mut Workspace>,
}

impl TurboQuantDecodeStep<'_, '_> {
    fn check_cache(&self, cache: &TurboQuantCache) -> std::result::Result<(), FerrattnError> {
        cache.check_for(self.plan, self.ordinal)?;
        if cache.config != self.plan.config {
            return Err(FerrattnError::PlanMismatch(format!(
                "the cache was made for {:?} but the step is planned for {:?}",
                cache.config, self.plan.config
            )));
        }
        Ok(())
    }

    /// The plan.
    pub fn plan(&self) -> &TurboQuantDecodePlan {
        self.plan
    }

    /// Units (warps) of the step's stream-K decode.
    pub fn units(&self) -> usize {
        self.plan.units()
    }

    /// Validates and enqueues the append of one layer's new tokens (`k_new`, `v_new`: f16
    /// `[batch, new_rows, heads_kv, head_dim]`, see [`TurboQuantDecodePlan::new`]) into its
    /// `cache` on `stream`: each token compressed alone by the cache's
    /// [`TurboQuantCache::compression`] (codes and norms equal the core's
    /// `TurboQuantCodec::compress` bit for bit on [`TurboQuantCompression::Exact`], within the
    /// fast paths' contract on the others). The cache
    /// must hold the plan's lengths before the step, or after it (the same step appended
    /// again: an eager run followed by its capture; the slots are rewritten). No allocation,
    /// synchronisation or copy.
    pub fn append(
        &self,
        k_new: &TensorView<'_>,
        v_new: &TensorView<'_>,
        cache: &mut TurboQuantCache,
        stream: Stream,
    ) -> Result<()> {
        validate_turboquant_append(self.plan, k_new, v_new, Location::Cuda(self.ordinal))?;
        self.check_cache(cache)?;
        let Some(prep) = &self.prepared.append else {
            return Err(FerrattnError::PlanMismatch(
                "append on a decode step planned without one".into(),
            ));
        };
        cache.check_lens(
            "the length before the step",
            &self.plan.lens_before,
            Some(&self.plan.lens_after),
        )?;
        // SAFETY: k_new / v_new were checked against the plan (f16 [batch, rows, heads_kv, d],
        // contiguous, long enough, 16-byte aligned, on this device); the cache against the plan
        // (device, shape, configuration, lengths, capacity); the caller promised the stream is
        // of this device (Stream::from_raw); `prep`'s tables are in the workspace this step
        // borrows, copied there by begin_decode on the caller's stream.
        unsafe {
            self.engine.enqueue_append_by(
                prep,
                &mut cache.inner,
                k_new.addr,
                v_new.addr,
                cache.compression.path(),
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }

    /// Validates one layer's views and enqueues its decode over `cache` on `stream`: the query
    /// preparation, the stream-K decode and the merge of its partials into `o` and `lse`. The
    /// cache must hold the plan's lengths after the step (appended first when the step
    /// appends). No allocation, synchronisation or copy.
    pub fn run(
        &self,
        x: &TurboQuantDecodeViews<'_, '_>,
        cache: &TurboQuantCache,
        stream: Stream,
    ) -> Result<()> {
        validate_turboquant_decode(self.plan, x, Location::Cuda(self.ordinal))?;
        self.check_cache(cache)?;
        cache.check_lens(
            "the length after the step's append",
            &self.plan.lens_after,
            None,
        )?;
        let prep = self
            .prepared
            .decode
            .as_ref()
            .expect("a TurboQuantDecodePlan always decodes");
        // SAFETY: q, o, lse checked against the plan (f16 / f32, shapes, contiguous, long
        // enough, 16-byte aligned, this device); the cache against the plan; the stream by
        // Stream::from_raw; the step's tables and scratch are in the workspace it borrows.
        unsafe {
            self.engine.enqueue_decode(
                prep,
                x.q.addr,
                &cache.inner,
                x.o.addr,
                x.lse.addr,
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }
}
