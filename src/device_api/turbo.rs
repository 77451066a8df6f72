//! The TurboAttention compressed cache on the device path (Kang et al., MLSys 2025): the same
//! shape of API as the Lean decoder above it.
//!
//! - [`TurboCache`] is a device object (constructed by [`TurboDevice::cache`], fields private):
//!   per (sequence, KV head) and for K and V, compressed blocks of 64 tokens at the head's bit
//!   width (INT4 or INT2, section 3.2) plus the INT8 buffer of the tokens after the last block
//!   under one universal scale (section 3.3). Its memory is allocated once, when it is made;
//!   [`TurboCache::memory`] and [`TurboCache::allocated_bytes`] account for it.
//! - [`TurboPrefillPlan`] / [`TurboDecodePlan`] are pure host values made once per step (every
//!   layer of a model has its own cache holding the same lengths); [`TurboDevice::begin_prefill`]
//!   and [`TurboDevice::begin_decode`] copy the step's small tables into the caller's
//!   [`Workspace`] on the caller's [`Stream`].
//! - Per layer, [`TurboPrefillStep::run`], [`TurboDecodeStep::append`] and
//!   [`TurboDecodeStep::decode`] check every view at the boundary ([`ViewError`] with the
//!   values, before any GPU access) and then only launch: no allocation, no host
//!   synchronisation, no host-device copy, so a decode step can be captured in a CUDA graph.
//!
//! Per-head bit widths are given when the cache is made: the paper's head priorities (section
//! 3.2) are statistics of the context that the host path measures on host tensors; on device
//! memory that would need a copy to the host, which this path never makes.
//!
//! Values are not checked for NaN/Inf here (that would read device memory on the host); the
//! host path ([`ferrattn_cuda::CudaBackend::turbo_decode_step`]) checks them.

use super::{check_view, Location, Stream, TensorView, ViewError, Workspace};
use crate::{FerrattnError, Result};
use ferrattn_core::turbo::{CacheMemory, TurboConfig, TurboKvCache};
use ferrattn_core::{AttentionProblem, DType, DeviceCaps};
use ferrattn_cuda::{
    CudaBackend, DecodeSchedule, DeviceTurboCache, TurboDecodeStepPlan, TurboPrefillStepPlan,
    TurboPrefillTensors, TurboStepKernels, TURBO_WORKSPACE_ALIGN,
};
use serde::Serialize;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// Tokens per compressed block and per INT8 buffer (`n_b` of section 3.3; the kernels' tile).
pub const TURBO_BLOCK_TOKENS: usize = ferrattn_cuda::turbo::TURBO_BLOCK;

/// Head dimensions the TurboAttention kernels have instances for.
pub const TURBO_HEAD_DIMS: [usize; 2] = [64, 128];

/// Shapes of a TurboAttention step (everything but the lengths).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TurboShape {
    /// Sequences.
    pub batch: usize,
    /// Query heads.
    pub heads_q: usize,
    /// KV heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Head dimension of Q, K and V (64 or 128).
    pub head_dim: usize,
    /// Element type of Q, K, V and O (f16 or bf16).
    pub dtype: DType,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
}

impl TurboShape {
    fn scale(&self) -> f32 {
        self.softmax_scale
            .unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    fn check(&self) -> std::result::Result<(), ViewError> {
        let positive = |what: &str, got: usize| {
            if got == 0 {
                Err(ViewError::Length {
                    what: what.into(),
                    got,
                    requirement: "positive".into(),
                })
            } else {
                Ok(())
            }
        };
        positive("batch", self.batch)?;
        positive("heads_kv", self.heads_kv)?;
        if self.heads_q == 0 || !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(ViewError::Length {
                what: "heads_q".into(),
                got: self.heads_q,
                requirement: format!("a positive multiple of heads_kv = {}", self.heads_kv),
            });
        }
        if !TURBO_HEAD_DIMS.contains(&self.head_dim) {
            return Err(ViewError::Length {
                what: "head_dim".into(),
                got: self.head_dim,
                requirement: format!("one of {TURBO_HEAD_DIMS:?} (the TurboAttention kernels)"),
            });
        }
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return Err(ViewError::DType {
                tensor: "q",
                got: self.dtype,
                expected: DType::F16,
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

/// What a cache is made for: its batch, heads, bit widths and per-sequence capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TurboCacheSpec {
    /// Sequences.
    pub batch: usize,
    /// KV heads.
    pub heads_kv: usize,
    /// Head dimension (64 or 128).
    pub head_dim: usize,
    /// Bits of each KV head's compressed blocks, 2 or 4 (section 3.2).
    pub bits: Vec<u8>,
    /// Tokens each sequence must be able to hold.
    pub capacity_tokens: usize,
}

impl TurboCacheSpec {
    /// Checks the spec (host only).
    pub fn validate(&self) -> std::result::Result<(), ViewError> {
        TurboShape {
            batch: self.batch,
            heads_q: self.heads_kv,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            dtype: DType::F16,
            softmax_scale: None,
        }
        .check()?;
        if self.bits.len() != self.heads_kv {
            return Err(ViewError::Length {
                what: "the number of per-head bit widths".into(),
                got: self.bits.len(),
                requirement: format!("one per KV head ({})", self.heads_kv),
            });
        }
        if let Some(h) = self.bits.iter().position(|&b| b != 2 && b != 4) {
            return Err(ViewError::Length {
                what: format!("bits of KV head {h}"),
                got: self.bits[h] as usize,
                requirement: "2 or 4 (INT2 or INT4 blocks)".into(),
            });
        }
        if self.capacity_tokens == 0 {
            return Err(ViewError::Length {
                what: "capacity_tokens".into(),
                got: 0,
                requirement: "positive".into(),
            });
        }
        super::check_cache_size(
            self.batch,
            self.heads_kv,
            self.head_dim,
            self.capacity_tokens,
        )
    }

    /// Device bytes the cache will hold (its capacity, not its contents); `usize::MAX` for a
    /// spec too large for [`TurboCacheSpec::validate`].
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
        ferrattn_cuda::turbo_cache_bytes(
            self.batch,
            self.heads_kv,
            self.head_dim,
            &self.bits,
            self.blocks_capacity(),
        )
    }

    /// Tokens a cache made to this spec holds per sequence (at least `capacity_tokens`: whole
    /// blocks plus a buffer one short of a block).
    pub fn capacity(&self) -> usize {
        self.blocks_capacity()
            .saturating_add(TURBO_BLOCK_TOKENS - 1)
    }

    /// Checks that sequences of `lens` tokens fit a cache made to this spec (host only).
    pub fn check_lengths(&self, lens: &[usize]) -> std::result::Result<(), ViewError> {
        super::check_capacity(lens, self.capacity())
    }

    /// Tokens of compressed blocks to allocate: enough blocks that the blocks plus a buffer one
    /// short of a block hold `capacity_tokens`.
    fn blocks_capacity(&self) -> usize {
        // saturating: the public `capacity` of a spec `validate` refuses must not overflow
        self.capacity_tokens
            .saturating_add(1)
            .saturating_sub(TURBO_BLOCK_TOKENS)
            .div_ceil(TURBO_BLOCK_TOKENS)
            .saturating_mul(TURBO_BLOCK_TOKENS)
    }
}

/// The TurboAttention compressed KV cache of one layer of a batch, in device memory it owns.
#[derive(Debug)]
pub struct TurboCache {
    inner: DeviceTurboCache,
    ordinal: usize,
}

impl TurboCache {
    /// Sequences.
    pub fn batch(&self) -> usize {
        self.inner.batch()
    }
    /// KV heads.
    pub fn heads_kv(&self) -> usize {
        self.inner.heads_kv
    }
    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.inner.head_dim
    }
    /// Bits of each KV head's blocks.
    pub fn bits(&self) -> &[u8] {
        &self.inner.bits
    }
    /// Tokens held per sequence (counting appends enqueued and not yet run).
    pub fn lens(&self) -> &[usize] {
        self.inner.lens()
    }
    /// Tokens one sequence can hold.
    pub fn capacity_tokens(&self) -> usize {
        self.inner.capacity_tokens()
    }
    /// Device of the cache.
    pub fn location(&self) -> Location {
        Location::Cuda(self.ordinal)
    }
    /// Memory the contents take, counted as the host cache counts it
    /// ([`TurboKvCache::memory`]): packed codes, channel parameters, block scales, INT8
    /// buffers and universal scales, and the fp16 bytes they stand for.
    pub fn memory(&self) -> CacheMemory {
        self.inner.memory()
    }
    /// Device memory allocated for the cache (its capacity).
    pub fn allocated_bytes(&self) -> usize {
        self.inner.allocated_bytes()
    }
    /// Copies the cache to the host as the core's type (waits for the device; for tests and
    /// inspection, not for a step).
    pub fn download(&self) -> Result<TurboKvCache> {
        Ok(self.inner.download()?)
    }
    /// The backend's cache (for the host-tensor entry points of `ferrattn_cuda`).
    pub fn device_cache(&self) -> &DeviceTurboCache {
        &self.inner
    }

    fn check_for(
        &self,
        batch: usize,
        heads_kv: usize,
        head_dim: usize,
        ordinal: usize,
    ) -> std::result::Result<(), ViewError> {
        if self.ordinal != ordinal {
            return Err(ViewError::Device {
                tensor: "cache",
                got: Location::Cuda(self.ordinal),
                expected: Location::Cuda(ordinal),
            });
        }
        let got = [self.batch(), self.heads_kv(), self.head_dim()];
        if got != [batch, heads_kv, head_dim] {
            return Err(ViewError::Shape {
                tensor: "cache",
                got: got.to_vec(),
                expected: vec![batch, heads_kv, head_dim],
                layout: "[batch, heads_kv, head_dim] of the cache",
            });
        }
        Ok(())
    }

    fn check_capacity(&self, lens: &[usize]) -> std::result::Result<(), ViewError> {
        super::check_capacity(lens, self.capacity_tokens())
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

/// A prefill step: the prompt's lengths and the workspace it needs. Pure host data.
#[derive(Clone, Debug)]
pub struct TurboPrefillPlan {
    shape: TurboShape,
    max_seqlen: usize,
    step: TurboPrefillStepPlan,
}

impl TurboPrefillPlan {
    /// Plans the prefill (Alg. 1) of prompts of `seqlens` tokens, padded to `max_seqlen`, that
    /// attend to themselves (`causal`: bottom-right mask), under `cfg` (SAS, its threshold).
    pub fn new(
        cfg: &TurboConfig,
        shape: &TurboShape,
        seqlens: &[usize],
        max_seqlen: usize,
        causal: bool,
    ) -> Result<TurboPrefillPlan> {
        shape.check()?;
        if seqlens.len() != shape.batch {
            return Err(ViewError::Length {
                what: "the number of sequence lengths".into(),
                got: seqlens.len(),
                requirement: format!("one per sequence of the batch ({})", shape.batch),
            }
            .into());
        }
        if let Some(b) = seqlens.iter().position(|&l| l > max_seqlen) {
            return Err(ViewError::Length {
                what: format!("seqlens[{b}]"),
                got: seqlens[b],
                requirement: format!("at most max_seqlen = {max_seqlen}"),
            }
            .into());
        }
        let mut p = AttentionProblem::uniform(
            shape.batch,
            max_seqlen,
            max_seqlen,
            shape.heads_q,
            shape.heads_kv,
            shape.head_dim,
            shape.head_dim,
            shape.dtype,
        );
        p.seqlens_q = seqlens.to_vec();
        p.seqlens_k = seqlens.to_vec();
        p.causal = causal;
        p.softmax_scale = shape.scale();
        Ok(TurboPrefillPlan {
            shape: *shape,
            max_seqlen,
            step: TurboPrefillStepPlan::new(cfg, &p)?,
        })
    }

    /// Workspace bytes of the step (the INT8 K/V tiles of BPQ stage 1, the INT8 Q tiles of the
    /// fast prefill's pre-pass and the length table): it depends on the query heads too.
    pub fn workspace_bytes(&self) -> usize {
        self.step.workspace_bytes()
    }

    /// The shapes.
    pub fn shape(&self) -> &TurboShape {
        &self.shape
    }

    /// Prompt lengths.
    pub fn seqlens(&self) -> &[usize] {
        &self.step.problem().seqlens_k
    }
}

/// A decode step: the caches' lengths before it, whether it appends a token per sequence, and
/// the decode schedule. Pure host data.
#[derive(Clone, Debug)]
pub struct TurboDecodePlan {
    shape: TurboShape,
    cfg: TurboConfig,
    step: TurboDecodeStepPlan,
}

impl TurboDecodePlan {
    /// Plans one decode step (Alg. 2, one query token per sequence) over caches holding
    /// `seqlens_before[b]` tokens of sequence `b`; with `append` each sequence takes the
    /// step's token first and its query sees it. `schedule` from
    /// [`TurboDevice::decode_schedule`] (or chosen by the caller).
    pub fn new(
        cfg: &TurboConfig,
        shape: &TurboShape,
        seqlens_before: &[usize],
        append: bool,
        schedule: DecodeSchedule,
    ) -> Result<TurboDecodePlan> {
        shape.check()?;
        ferrattn_cuda::turbo::check_supported(cfg, shape.dtype, shape.head_dim)?;
        if seqlens_before.len() != shape.batch {
            return Err(ViewError::Length {
                what: "the number of sequence lengths".into(),
                got: seqlens_before.len(),
                requirement: format!("one per sequence of the batch ({})", shape.batch),
            }
            .into());
        }
        if !append {
            if let Some(b) = seqlens_before.iter().position(|&l| l == 0) {
                return Err(ViewError::Length {
                    what: format!("seqlens_before[{b}]"),
                    got: 0,
                    requirement: "positive: a decode without an append needs a token to see".into(),
                }
                .into());
            }
        }
        Ok(TurboDecodePlan {
            shape: *shape,
            cfg: cfg.clone(),
            step: TurboDecodeStepPlan::new(
                shape.heads_q,
                shape.heads_kv,
                shape.head_dim,
                shape.dtype,
                seqlens_before,
                append,
                schedule,
            )?,
        })
    }

    /// Workspace bytes of the step (its tables and the decode partials).
    pub fn workspace_bytes(&self) -> usize {
        self.step.workspace_bytes()
    }
    /// The shapes.
    pub fn shape(&self) -> &TurboShape {
        &self.shape
    }
    /// Tokens per sequence after the step's append.
    pub fn seqlens_after(&self) -> &[usize] {
        self.step.lens_after()
    }
    /// The backend's plan (schedule, flushes, workspace layout).
    pub fn step(&self) -> &TurboDecodeStepPlan {
        &self.step
    }
    /// Whether a graph captured from this plan's launches may run with `other`'s tables in
    /// the workspace (same grids and offsets; see [`TurboDecodeStepPlan::same_launch`]).
    pub fn same_launch(&self, other: &TurboDecodePlan) -> bool {
        self.shape == other.shape && self.cfg == other.cfg && self.step.same_launch(&other.step)
    }
}

/// The tensors of one layer's prefill.
#[derive(Clone, Copy, Debug)]
pub struct TurboPrefillViews<'v, 'a> {
    /// `[batch, max_seqlen, heads_q, head_dim]`.
    pub q: &'v TensorView<'a>,
    /// `[batch, max_seqlen, heads_kv, head_dim]`.
    pub k: &'v TensorView<'a>,
    /// As `k`.
    pub v: &'v TensorView<'a>,
    /// Output, as `q`.
    pub o: &'v TensorView<'a>,
    /// Output `f32 [batch, heads_q, max_seqlen]`, natural log.
    pub lse: &'v TensorView<'a>,
}

/// The tensors of one layer's decode.
#[derive(Clone, Copy, Debug)]
pub struct TurboDecodeViews<'v, 'a> {
    /// `[batch, 1, heads_q, head_dim]`.
    pub q: &'v TensorView<'a>,
    /// Output, as `q`.
    pub o: &'v TensorView<'a>,
    /// Output `f32 [batch, heads_q, 1]`, natural log.
    pub lse: &'v TensorView<'a>,
}

/// The boundary check of one layer's prefill views (host only).
pub fn validate_prefill(
    plan: &TurboPrefillPlan,
    x: &TurboPrefillViews<'_, '_>,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let s = &plan.shape;
    let (b, n) = (s.batch, plan.max_seqlen);
    const QL: &str = "[batch, seqlen, heads_q, head_dim]";
    const KL: &str = "[batch, seqlen, heads_kv, head_dim]";
    let q = [b, n, s.heads_q, s.head_dim];
    let kv = [b, n, s.heads_kv, s.head_dim];
    check_view("q", x.q, &q, QL, s.dtype, location)?;
    check_view("k", x.k, &kv, KL, s.dtype, location)?;
    check_view("v", x.v, &kv, KL, s.dtype, location)?;
    check_view("o", x.o, &q, QL, s.dtype, location)?;
    check_view(
        "lse",
        x.lse,
        &[b, s.heads_q, n],
        "[batch, heads_q, seqlen], f32",
        DType::F32,
        location,
    )
}

/// The boundary check of one layer's decode views (host only).
pub fn validate_decode(
    plan: &TurboDecodePlan,
    x: &TurboDecodeViews<'_, '_>,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let s = &plan.shape;
    let q = [s.batch, 1, s.heads_q, s.head_dim];
    const QL: &str = "[batch, 1, heads_q, head_dim]";
    check_view("q", x.q, &q, QL, s.dtype, location)?;
    check_view("o", x.o, &q, QL, s.dtype, location)?;
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
pub fn validate_append(
    plan: &TurboDecodePlan,
    k_new: &TensorView<'_>,
    v_new: &TensorView<'_>,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let s = &plan.shape;
    let kv = [s.batch, 1, s.heads_kv, s.head_dim];
    const KL: &str = "[batch, 1, heads_kv, head_dim]";
    check_view("k_new", k_new, &kv, KL, s.dtype, location)?;
    check_view("v_new", v_new, &kv, KL, s.dtype, location)
}

fn check_workspace(
    needed: usize,
    w: &Workspace,
    ordinal: usize,
) -> std::result::Result<(), ViewError> {
    if w.ordinal != ordinal {
        return Err(ViewError::Device {
            tensor: "workspace",
            got: Location::Cuda(w.ordinal),
            expected: Location::Cuda(ordinal),
        });
    }
    if w.bytes < needed {
        return Err(ViewError::Workspace {
            needed,
            declared: w.bytes,
        });
    }
    if !w.addr.is_multiple_of(TURBO_WORKSPACE_ALIGN as u64) {
        return Err(ViewError::Misaligned {
            tensor: "workspace",
            addr: w.addr,
            align: TURBO_WORKSPACE_ALIGN as u64,
        });
    }
    Ok(())
}

/// TurboAttention on one CUDA device through caller-owned memory and streams.
#[derive(Debug)]
pub struct TurboDevice {
    backend: CudaBackend,
    ordinal: usize,
    /// Kernels per (dtype, head dim), resolved once.
    kernels: Mutex<Vec<Arc<TurboStepKernels>>>,
}

impl TurboDevice {
    /// TurboAttention on CUDA device `ordinal` (kernels load at first use).
    pub fn new(ordinal: usize) -> Result<TurboDevice> {
        Self::with_options(ordinal, ferrattn_cuda::Options::default())
    }

    /// As [`TurboDevice::new`] with the backend's options. The decode follows the backend's
    /// default: on sm_90 the fast-contract kernels (O within 2e-2 and LSE within 1e-2 of the
    /// bit-exact ones; docs/TURBO_CUDA.md), elsewhere the bit-exact ones;
    /// [`ferrattn_cuda::Options::exact_turbo_decode`] selects the bit-exact kernels everywhere,
    /// [`ferrattn_cuda::Options::fast_turbo_decode`] the fast ones everywhere.
    pub fn with_options(ordinal: usize, options: ferrattn_cuda::Options) -> Result<TurboDevice> {
        let backend = CudaBackend::with_options(ordinal, options);
        backend.gpu()?;
        Ok(TurboDevice {
            backend,
            ordinal,
            kernels: Mutex::new(Vec::new()),
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

    /// The backend (for the host-tensor entry points, e.g. to compare with them).
    pub fn backend(&self) -> &CudaBackend {
        &self.backend
    }

    /// An empty cache made to `spec` (checked first). Allocates and zeroes its memory once,
    /// synchronously: make caches before a step, never inside one.
    pub fn cache(&self, spec: &TurboCacheSpec) -> Result<TurboCache> {
        spec.validate()?;
        let inner = self.backend.turbo_step_cache(
            spec.batch,
            spec.heads_kv,
            spec.head_dim,
            spec.bits.clone(),
            spec.blocks_capacity(),
        )?;
        Ok(TurboCache {
            inner,
            ordinal: self.ordinal,
        })
    }

    /// Enqueues the emptying of `cache` on `stream`, so a new prompt can be prefilled into it.
    pub fn reset(&self, cache: &mut TurboCache, stream: Stream) -> Result<()> {
        cache.check_for(
            cache.batch(),
            cache.heads_kv(),
            cache.head_dim(),
            self.ordinal,
        )?;
        // SAFETY: the caller promised the stream is of this device (Stream::from_raw); the
        // cache is this device's (checked above).
        unsafe {
            ferrattn_cuda::turbo_reset_cache(
                self.backend.gpu()?,
                &mut cache.inner,
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }

    /// The decode schedule the host path ([`CudaBackend::turbo_decode`]) picks for caches of
    /// `seqlens_after` tokens: one warp per output tile when the tiles fill the GPU, else
    /// stream-K over the resident warps (LeanAttention appendix E).
    pub fn decode_schedule(
        &self,
        shape: &TurboShape,
        seqlens_after: &[usize],
    ) -> Result<DecodeSchedule> {
        shape.check()?;
        Ok(self.backend.turbo_step_schedule(
            seqlens_after,
            shape.heads_q,
            shape.heads_kv,
            shape.dtype,
            shape.head_dim,
        )?)
    }

    fn kernels(&self, dtype: DType, head_dim: usize) -> Result<Arc<TurboStepKernels>> {
        let mut list = self.kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = list
            .iter()
            .find(|k| (k.dtype(), k.head_dim()) == (dtype, head_dim))
        {
            return Ok(k.clone());
        }
        let k = Arc::new(self.backend.turbo_step_kernels(dtype, head_dim)?);
        list.push(k.clone());
        Ok(k)
    }

    /// Starts a prefill step: checks the workspace and enqueues the copy of the step's table
    /// into it on `stream`. Once per step, outside a graph capture.
    pub fn begin_prefill<'p, 'w>(
        &self,
        plan: &'p TurboPrefillPlan,
        workspace: &'w mut Workspace,
        stream: Stream,
    ) -> Result<TurboPrefillStep<'p, 'w>> {
        check_workspace(plan.workspace_bytes(), workspace, self.ordinal)?;
        let kernels = self.kernels(plan.shape.dtype, plan.shape.head_dim)?;
        // SAFETY: the workspace was checked (device, size, alignment) and the caller promised
        // it is device memory nothing else uses (Workspace::cuda); the stream by
        // Stream::from_raw.
        unsafe {
            kernels.upload_prefill(&plan.step, workspace.addr, stream.as_raw() as _)?;
        }
        Ok(TurboPrefillStep {
            plan,
            kernels,
            workspace: workspace.addr,
            ordinal: self.ordinal,
            _workspace: PhantomData,
        })
    }

    /// Starts a decode step: checks the workspace and enqueues the copy of the step's tables
    /// into it on `stream`. Once per step, outside a graph capture.
    ///
    /// A CUDA graph captured from one step's launches may be replayed after a later step began
    /// in the same workspace only when [`TurboDecodePlan::same_launch`] holds for the two
    /// plans. A replay does not move the caches' host lengths: the eager launches of a step
    /// do, and [`TurboDecodeStep::append`] accepts a cache already at the step's lengths.
    pub fn begin_decode<'p, 'w>(
        &self,
        plan: &'p TurboDecodePlan,
        workspace: &'w mut Workspace,
        stream: Stream,
    ) -> Result<TurboDecodeStep<'p, 'w>> {
        check_workspace(plan.workspace_bytes(), workspace, self.ordinal)?;
        let kernels = self.kernels(plan.shape.dtype, plan.shape.head_dim)?;
        // SAFETY: as in begin_prefill.
        unsafe {
            kernels.upload_decode(&plan.step, workspace.addr, stream.as_raw() as _)?;
        }
        Ok(TurboDecodeStep {
            plan,
            kernels,
            workspace: workspace.addr,
            ordinal: self.ordinal,
            _workspace: PhantomData,
        })
    }
}

/// A prefill step whose table is in the workspace: launches per layer.
#[derive(Debug)]
pub struct TurboPrefillStep<'p, 'w> {
    plan: &'p TurboPrefillPlan,
    kernels: Arc<TurboStepKernels>,
    workspace: u64,
    ordinal: usize,
    _workspace: PhantomData<&'w mut Workspace>,
}

impl TurboPrefillStep<'_, '_> {
    /// Validates one layer's views and its (empty) cache and enqueues the prefill on `stream`:
    /// K and V compressed into `cache`, attention into `o` and `lse`. No allocation, no
    /// synchronisation, no copy.
    pub fn run(
        &self,
        x: &TurboPrefillViews<'_, '_>,
        cache: &mut TurboCache,
        stream: Stream,
    ) -> Result<()> {
        let s = &self.plan.shape;
        validate_prefill(self.plan, x, Location::Cuda(self.ordinal))?;
        cache.check_for(s.batch, s.heads_kv, s.head_dim, self.ordinal)?;
        cache.check_lens("empty (0 tokens) before a prefill", &vec![0; s.batch], None)?;
        cache.check_capacity(self.plan.seqlens())?;
        let t = TurboPrefillTensors {
            q: x.q.addr,
            k: x.k.addr,
            v: x.v.addr,
            o: x.o.addr,
            lse: x.lse.addr,
        };
        // SAFETY: every view was checked against the plan (shape, dtype, device, length,
        // contiguity, alignment), the cache against the plan (device, shape, empty, capacity)
        // and the workspace and its table by begin_prefill.
        unsafe {
            self.kernels.prefill(
                &self.plan.step,
                &t,
                &mut cache.inner,
                self.workspace,
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }
}

/// A decode step whose tables are in the workspace: launches per layer. It holds the
/// workspace's mutable borrow, so the tables stay this step's while it lives.
#[derive(Debug)]
pub struct TurboDecodeStep<'p, 'w> {
    plan: &'p TurboDecodePlan,
    kernels: Arc<TurboStepKernels>,
    workspace: u64,
    ordinal: usize,
    _workspace: PhantomData<&'w mut Workspace>,
}

impl TurboDecodeStep<'_, '_> {
    fn check_cache(&self, cache: &TurboCache) -> std::result::Result<(), ViewError> {
        let s = &self.plan.shape;
        cache.check_for(s.batch, s.heads_kv, s.head_dim, self.ordinal)
    }

    /// Validates and enqueues the append of one layer's new token per sequence (`k_new`,
    /// `v_new`: `[batch, 1, heads_kv, head_dim]`) into its `cache` on `stream`, with the flush
    /// of every INT8 buffer that becomes full (section 3.3). The cache must hold the plan's
    /// lengths before the step, or after it (the same step appended again: an eager run
    /// followed by its capture; the slot is rewritten). No allocation, synchronisation or copy.
    pub fn append(
        &self,
        k_new: &TensorView<'_>,
        v_new: &TensorView<'_>,
        cache: &mut TurboCache,
        stream: Stream,
    ) -> Result<()> {
        validate_append(self.plan, k_new, v_new, Location::Cuda(self.ordinal))?;
        self.check_cache(cache)?;
        let step = &self.plan.step;
        if !step.appends() {
            return Err(FerrattnError::PlanMismatch(
                "append on a decode step planned without one".into(),
            ));
        }
        cache.check_lens(
            "the length before the step",
            step.lens_before(),
            Some(step.lens_after()),
        )?;
        cache.check_capacity(step.lens_after())?;
        // SAFETY: views checked against the plan, the cache against the plan (device, shape,
        // lengths, capacity), the workspace and its tables by begin_decode.
        unsafe {
            self.kernels.append(
                step,
                k_new.addr,
                v_new.addr,
                &mut cache.inner,
                self.workspace,
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }

    /// Validates one layer's views and enqueues its decode (Alg. 2) over `cache` on `stream`:
    /// the decode kernel and the merge of its partials. The cache must hold the plan's lengths
    /// after the step (appended first when the step appends). No allocation, synchronisation
    /// or copy.
    pub fn decode(
        &self,
        x: &TurboDecodeViews<'_, '_>,
        cache: &TurboCache,
        stream: Stream,
    ) -> Result<()> {
        validate_decode(self.plan, x, Location::Cuda(self.ordinal))?;
        self.check_cache(cache)?;
        let step = &self.plan.step;
        cache.check_lens(
            "the length after the step's append",
            step.lens_after(),
            None,
        )?;
        // SAFETY: as in append.
        unsafe {
            self.kernels.decode(
                step,
                &self.plan.cfg,
                x.q.addr,
                x.o.addr,
                x.lse.addr,
                self.plan.shape.scale(),
                &cache.inner,
                self.workspace,
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }
}
