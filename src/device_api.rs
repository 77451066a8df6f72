//! The device path: attention on memory and streams the caller owns, as inference engines call
//! it (per layer, per decode step, inside CUDA graphs).
//!
//! The split is FlashInfer's `BatchDecodeWithPagedKVCacheWrapper`:
//!
//! 1. [`DecodePlan::new`] once per decode step, on the host: pure and serialisable; it checks the
//!    step's lengths and page table and says how many workspace bytes the step needs.
//! 2. The caller allocates the workspace once (for its largest step) and wraps it in a
//!    [`Workspace`].
//! 3. [`LeanDecoder::begin_step`] copies the step's small tables into the workspace on the
//!    caller's [`Stream`] (one host-to-device copy per step, as FlashInfer's `plan` does).
//! 4. [`DecodeStep::run`] per layer (and [`DecodeStep::append`] for the step's new tokens) only
//!    launches: no allocation, no host synchronisation, no host-device copy, so the layers of a
//!    step can be captured in one CUDA graph and replayed.
//!
//! **The boundary.** Tensors come in as [`TensorView`]s (a host slice or a CUDA device address
//! with shape, strides in elements, dtype and [`Location`]). Every view is checked against the
//! plan by [`validate`] before any GPU access: rank, shape agreement of q/k/v/o/lse, the buffer
//! length the caller declared against shape and strides, contiguity (the kernels read dense
//! rows), 16-byte alignment (the kernels load 16-byte vectors), dtype and device. Page tables are
//! checked against the pool and sequence lengths against their pages when the plan is made
//! ([`DecodePlan::new`]), and the plan's fields are private, so nothing that passed a check can
//! change after it. Every failure is a [`ViewError`] carrying the values. Behind the boundary the
//! CUDA backend assumes valid input (its entry points are `unsafe` and say what they rely on).

use crate::{FerrattnError, Result};
use ferrattn_core::{lean, AttentionProblem, DType, DeviceCaps, KvLayout};
use ferrattn_cuda::{
    CudaBackend, KvStorage, LeanKernels, LeanStepPlan, LeanTensors, Paging, WorkspaceLayout,
    MAX_POOL_ROWS, PAGE_SIZES, WORKSPACE_ALIGN,
};
use serde::Serialize;
use std::marker::PhantomData;
use std::sync::Arc;
use thiserror::Error;

mod merge;
mod turbo;
mod turboquant;
/// The decode schedules of the TurboAttention cache (re-exported from the CUDA backend).
pub use ferrattn_cuda::DecodeSchedule as TurboSchedule;
pub use merge::{validate_merge, MergeViews};
pub use turbo::{
    validate_append, validate_decode, validate_prefill, TurboCache, TurboCacheSpec,
    TurboDecodePlan, TurboDecodeStep, TurboDecodeViews, TurboDevice, TurboPrefillPlan,
    TurboPrefillStep, TurboPrefillViews, TurboShape, TURBO_BLOCK_TOKENS, TURBO_HEAD_DIMS,
};
pub use turboquant::{
    validate_turboquant_append, validate_turboquant_decode, validate_turboquant_workspace,
    TurboQuantCache, TurboQuantCacheSpec, TurboQuantCompression, TurboQuantDecodePlan,
    TurboQuantDecodeStep, TurboQuantDecodeViews, TurboQuantDevice, TurboQuantMemory,
    TurboQuantSchedule, TurboQuantShape, UnknownTurboQuantCompression, TURBOQUANT_HEAD_DIMS,
    TURBOQUANT_TILE_TOKENS, TURBOQUANT_WORKSPACE_ALIGN,
};

/// Alignment the kernels need of every tensor's address, bytes (16-byte vector loads).
pub const TENSOR_ALIGN: u64 = 16;

/// Where a tensor's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Location {
    /// Host memory.
    Cpu,
    /// Memory of CUDA device `ordinal`.
    Cuda(usize),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Cpu => write!(f, "cpu"),
            Location::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// A CUDA stream the caller owns (`CUstream` / `cudaStream_t`, e.g. torch's current stream).
/// The null stream is the legacy default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    raw: usize,
}

impl Stream {
    /// The legacy default stream (null).
    pub const LEGACY_DEFAULT: Stream = Stream { raw: 0 };

    /// Wraps a raw `CUstream`.
    ///
    /// # Safety
    /// `raw` is null or a live stream of the context of the device the work runs on, and stays
    /// alive while work enqueued through this handle runs.
    pub unsafe fn from_raw(raw: *mut std::ffi::c_void) -> Stream {
        Stream { raw: raw as usize }
    }

    /// The raw `CUstream`.
    pub fn as_raw(&self) -> *mut std::ffi::c_void {
        self.raw as *mut std::ffi::c_void
    }
}

/// Element types a host slice can be viewed as.
pub trait HostElement: Copy + sealed::Sealed {
    /// The dtype of this element type.
    const DTYPE: DType;
}
impl HostElement for f32 {
    const DTYPE: DType = DType::F32;
}
impl HostElement for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl HostElement for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A view of a tensor in memory the caller owns: address, declared length, shape, strides (in
/// elements), dtype and location. Constructed only through checked functions; fields private.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorView<'a> {
    addr: u64,
    bytes: usize,
    shape: Vec<usize>,
    strides: Vec<usize>,
    dtype: DType,
    location: Location,
    _borrow: PhantomData<&'a [u8]>,
}

/// Row-major strides of `shape`, in elements.
///
/// Saturating: a shape with more elements than a `usize` counts gets `usize::MAX` strides, which
/// [`validate`] then refuses as a short buffer (an overflowing product must not wrap into a small
/// extent that passes the length check).
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1].saturating_mul(shape[i + 1]);
    }
    s
}

impl<'a> TensorView<'a> {
    fn make(
        addr: u64,
        bytes: usize,
        shape: &[usize],
        strides: &[usize],
        dtype: DType,
        location: Location,
    ) -> std::result::Result<TensorView<'a>, ViewError> {
        if shape.len() != strides.len() {
            return Err(ViewError::StridesRank {
                shape: shape.to_vec(),
                strides: strides.to_vec(),
            });
        }
        Ok(TensorView {
            addr,
            bytes,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            dtype,
            location,
            _borrow: PhantomData,
        })
    }

    /// A contiguous view of a host slice.
    pub fn host<T: HostElement>(
        data: &'a [T],
        shape: &[usize],
    ) -> std::result::Result<TensorView<'a>, ViewError> {
        TensorView::host_strided(data, shape, &contiguous_strides(shape))
    }

    /// A strided view of a host slice.
    pub fn host_strided<T: HostElement>(
        data: &'a [T],
        shape: &[usize],
        strides: &[usize],
    ) -> std::result::Result<TensorView<'a>, ViewError> {
        TensorView::make(
            data.as_ptr() as u64,
            std::mem::size_of_val(data),
            shape,
            strides,
            T::DTYPE,
            Location::Cpu,
        )
    }

    /// A view of CUDA device memory: `bytes` bytes at `addr` on device `ordinal`.
    ///
    /// # Safety
    /// `addr` is the start of at least `bytes` bytes of device memory of device `ordinal`'s
    /// primary context, which stay allocated (and are not written by others while read) until
    /// the work enqueued with this view has run. Everything else (length against shape and
    /// strides, alignment, dtype, device) is checked by [`validate`].
    pub unsafe fn cuda(
        addr: u64,
        bytes: usize,
        ordinal: usize,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
    ) -> std::result::Result<TensorView<'a>, ViewError> {
        TensorView::make(addr, bytes, shape, strides, dtype, Location::Cuda(ordinal))
    }

    /// Address of element 0.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes the owner declared.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the memory is.
    pub fn location(&self) -> Location {
        self.location
    }

    /// Bytes from element 0 to one past the last element the shape and strides reach;
    /// `usize::MAX` when that overflows (no buffer is that long, so the length check refuses it).
    pub fn extent_bytes(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(0usize, |last, (&n, &s)| {
                last.checked_add((n - 1).checked_mul(s)?)
            })
            .and_then(|last| last.checked_add(1)?.checked_mul(self.dtype.size_bytes()))
            .unwrap_or(usize::MAX)
    }

    /// Whether the strides are row-major for the shape (dimensions of extent 1 may have any
    /// stride, as in torch).
    pub fn is_contiguous(&self) -> bool {
        let want = contiguous_strides(&self.shape);
        self.shape
            .iter()
            .zip(self.strides.iter().zip(&want))
            .all(|(&n, (&s, &w))| n == 1 || s == w)
    }
}

/// Caller-owned device scratch for one decode step's tables and partials. Neither `Clone` nor
/// `Copy`: a step borrows it mutably ([`LeanDecoder::begin_step`]), so no other step can write
/// its tables while that step's launches may still be enqueued.
#[derive(Debug, PartialEq, Eq)]
pub struct Workspace {
    addr: u64,
    bytes: usize,
    ordinal: usize,
}

impl Workspace {
    /// `bytes` bytes of device memory at `addr` on device `ordinal`.
    ///
    /// # Safety
    /// As [`TensorView::cuda`]; the memory is used by nothing else while steps run in it.
    pub unsafe fn cuda(addr: u64, bytes: usize, ordinal: usize) -> Workspace {
        Workspace {
            addr,
            bytes,
            ordinal,
        }
    }

    /// Device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A tensor or argument rejected at the boundary, with the values that were wrong.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ViewError {
    /// Shape and strides of different ranks.
    #[error("shape {shape:?} has {} dimensions but strides {strides:?} have {}", shape.len(), strides.len())]
    StridesRank {
        /// The shape.
        shape: Vec<usize>,
        /// The strides.
        strides: Vec<usize>,
    },
    /// A tensor of the wrong rank.
    #[error("{tensor} has rank {got} ({shape:?}); expected rank {expected} ({layout})")]
    Rank {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its rank.
        got: usize,
        /// The rank needed.
        expected: usize,
        /// The layout, e.g. `[batch, seqlen_q, heads_q, head_dim]`.
        layout: &'static str,
    },
    /// A tensor whose shape disagrees with the plan or the other tensors.
    #[error("{tensor} has shape {got:?} but {expected:?} is needed ({layout})")]
    Shape {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape.
        got: Vec<usize>,
        /// The shape the plan and the other tensors imply.
        expected: Vec<usize>,
        /// The layout.
        layout: &'static str,
    },
    /// A buffer shorter than its shape and strides reach.
    #[error("{tensor} reaches {needed} bytes with shape {shape:?} and strides {strides:?}, but its buffer holds {declared}")]
    ShortBuffer {
        /// Which tensor.
        tensor: &'static str,
        /// Bytes the shape and strides reach.
        needed: usize,
        /// Bytes the owner declared.
        declared: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides.
        strides: Vec<usize>,
    },
    /// Strides the kernel cannot read.
    #[error("{tensor} has strides {got:?} for shape {shape:?}; the kernel reads dense rows, strides {expected:?}")]
    NotContiguous {
        /// Which tensor.
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides.
        got: Vec<usize>,
        /// Row-major strides.
        expected: Vec<usize>,
    },
    /// An address the kernel's vector loads cannot use.
    #[error("{tensor} starts at {addr:#x}, not a multiple of {align} bytes")]
    Misaligned {
        /// Which tensor.
        tensor: &'static str,
        /// Its address.
        addr: u64,
        /// The alignment needed.
        align: u64,
    },
    /// The wrong element type.
    #[error("{tensor} is {got} but {expected} is needed")]
    DType {
        /// Which tensor.
        tensor: &'static str,
        /// Its dtype.
        got: DType,
        /// The dtype needed.
        expected: DType,
    },
    /// Memory on another device than the work.
    #[error("{tensor} is on {got} but the work runs on {expected}")]
    Device {
        /// Which tensor.
        tensor: &'static str,
        /// Where it is.
        got: Location,
        /// Where it must be.
        expected: Location,
    },
    /// A workspace too small for the step.
    #[error("workspace of {declared} bytes; the step needs {needed}")]
    Workspace {
        /// Bytes the step needs.
        needed: usize,
        /// Bytes given.
        declared: usize,
    },
    /// A page-table entry outside the pool.
    #[error(
        "page table entry ({sequence}, {slot}) is {page}, outside the pool of {num_pages} pages"
    )]
    PageOutOfPool {
        /// Sequence.
        sequence: usize,
        /// Slot within its row.
        slot: usize,
        /// The entry.
        page: i32,
        /// Pages in the pool.
        num_pages: usize,
    },
    /// A sequence longer than the pages its row can hold.
    #[error("sequence {sequence} has {len} tokens but its page-table row holds {max_pages} pages of {page_size} ({} tokens)", max_pages * page_size)]
    SequenceLongerThanPages {
        /// Sequence.
        sequence: usize,
        /// Its length.
        len: usize,
        /// Entries per row.
        max_pages: usize,
        /// Tokens per page.
        page_size: usize,
    },
    /// A sequence longer than its compressed cache can hold.
    #[error("sequence {sequence} would hold {len} tokens but its cache holds at most {capacity}")]
    SequenceLongerThanCache {
        /// Sequence.
        sequence: usize,
        /// Its length.
        len: usize,
        /// Tokens the cache holds per sequence.
        capacity: usize,
    },
    /// A page table of the wrong length.
    #[error("page table has {got} entries; {batch} sequences x {max_pages} pages need {}", batch * max_pages)]
    PageTableLength {
        /// Entries given.
        got: usize,
        /// Sequences.
        batch: usize,
        /// Entries per row.
        max_pages: usize,
    },
    /// A page size without a kernel.
    #[error("page size {got}; supported: {supported:?}")]
    PageSize {
        /// The page size.
        got: usize,
        /// The supported ones.
        supported: Vec<usize>,
    },
    /// Sequence lengths that disagree with the step.
    #[error("{what} is {got}; {requirement}")]
    Length {
        /// What was measured.
        what: String,
        /// Its value.
        got: usize,
        /// What it must satisfy.
        requirement: String,
    },
}

/// Shapes of one decode step (everything but the lengths).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct DecodeShape {
    /// Sequences.
    pub batch: usize,
    /// Query tokens per sequence this step (1 for plain decode, up to 8).
    pub query_len: usize,
    /// Query heads.
    pub heads_q: usize,
    /// KV heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Head dimension of Q, K and V.
    pub head_dim: usize,
    /// Element type of Q, K, V and O.
    pub dtype: DType,
    /// Bottom-right causal mask among the step's query tokens.
    pub causal: bool,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub softmax_scale: Option<f32>,
}

/// Where the step's K and V are.
#[derive(Clone, Copy, Debug)]
pub enum KvCache<'t> {
    /// `[batch, max_seqlen_k, heads_kv, head_dim]` each.
    Contiguous {
        /// Padded sequence extent of the buffers.
        max_seqlen_k: usize,
    },
    /// Page pools `[num_pages, page_size, heads_kv, head_dim]` each (NHD, as vLLM and
    /// FlashInfer) and a host page table `[batch, max_pages]`.
    Paged {
        /// Tokens per page (16 or 64).
        page_size: usize,
        /// Pages in each pool.
        num_pages: usize,
        /// Entries per page-table row.
        max_pages: usize,
        /// Row-major `[batch, max_pages]`: the pool page of each logical page.
        page_table: &'t [i32],
    },
}

/// Which schedule a step uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeanSchedule {
    /// The Lean planner's schedule, the default: stream-K (Lean appendix E), or one CTA per tile
    /// when equally long tiles already fill the grid (`ferrattn_core::lean::plan`); either fits
    /// [`DecodePlan::stream_k_workspace_bound`].
    #[default]
    StreamK,
    /// FlashDecoding's fixed split (`None`: FlashAttention-2's split heuristic).
    FixedSplit(Option<usize>),
}

/// One decode step's plan: pure host data (see the module docs). Fields are private. Read back
/// from JSON it is checked again (lengths, page table, schedule), as a new plan is.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(try_from = "PlanInputs")]
pub struct DecodePlan {
    shape: DecodeShape,
    step: LeanStepPlan,
}

#[derive(serde::Deserialize)]
struct PlanInputs {
    shape: DecodeShape,
    step: LeanStepPlan,
}

impl TryFrom<PlanInputs> for DecodePlan {
    type Error = FerrattnError;
    fn try_from(x: PlanInputs) -> Result<DecodePlan> {
        // the step re-checked itself while deserialising; here: the shape agrees with it
        let (s, p) = (&x.shape, x.step.problem());
        let agree = s.batch == p.batch
            && s.query_len == p.max_seqlen_q
            && s.heads_q == p.heads_q
            && s.heads_kv == p.heads_kv
            && s.head_dim == p.head_dim_qk
            && s.dtype == p.dtype
            && s.causal == p.causal;
        if !agree {
            return Err(FerrattnError::PlanMismatch(format!(
                "the plan's shape {s:?} disagrees with its step's problem"
            )));
        }
        let kv = match x.step.kv() {
            KvStorage::Contiguous => KvCache::Contiguous {
                max_seqlen_k: p.max_seqlen_k,
            },
            KvStorage::Paged(pg) => KvCache::Paged {
                page_size: pg.page_size(),
                num_pages: pg.num_pages(),
                max_pages: pg.max_pages(),
                page_table: pg.table(),
            },
        };
        validate_lengths(s, &p.seqlens_k, &kv)?;
        Ok(DecodePlan {
            shape: x.shape,
            step: x.step,
        })
    }
}

/// The first sequence longer than a compressed cache's `capacity` tokens, as a typed error.
pub(crate) fn check_capacity(
    lens: &[usize],
    capacity: usize,
) -> std::result::Result<(), ViewError> {
    match lens.iter().position(|&l| l > capacity) {
        Some(b) => Err(ViewError::SequenceLongerThanCache {
            sequence: b,
            len: lens[b],
            capacity,
        }),
        None => Ok(()),
    }
}

/// The size checks a compressed cache spec shares (TurboAttention, TurboQuant): the kernels take
/// lengths as 32-bit integers, and the cache's bytes (bounded above by
/// `4 * batch * heads_kv * (capacity_tokens + 1024) * (head_dim + 8)`, which covers both layouts'
/// codes, scales, norms and buffers) must fit one allocation. Past either, the size arithmetic
/// of `allocated_bytes` and the kernels' tables would overflow or truncate.
pub(crate) fn check_cache_size(
    batch: usize,
    heads_kv: usize,
    head_dim: usize,
    capacity_tokens: usize,
) -> std::result::Result<(), ViewError> {
    if capacity_tokens > i32::MAX as usize {
        return Err(ViewError::Length {
            what: "capacity_tokens".into(),
            got: capacity_tokens,
            requirement: format!(
                "at most {} (the kernels take lengths as 32-bit integers)",
                i32::MAX
            ),
        });
    }
    let bound = 4
        * batch as u128
        * heads_kv as u128
        * (capacity_tokens as u128 + 1024)
        * (head_dim as u128 + 8);
    if bound > isize::MAX as u128 {
        return Err(ViewError::Length {
            what: format!(
                "a cache of batch {batch} x heads_kv {heads_kv} x {capacity_tokens} tokens x head_dim {head_dim}"
            ),
            got: capacity_tokens,
            requirement: format!(
                "fewer tokens or sequences: its bytes (up to {bound}) must fit one allocation (at most {} bytes)",
                isize::MAX
            ),
        });
    }
    Ok(())
}

/// Checks a step's lengths and page table (the plan-time half of the boundary).
pub fn validate_lengths(
    shape: &DecodeShape,
    seqlens_k: &[usize],
    kv: &KvCache<'_>,
) -> std::result::Result<(), ViewError> {
    if seqlens_k.len() != shape.batch {
        return Err(ViewError::Length {
            what: "the number of sequence lengths".into(),
            got: seqlens_k.len(),
            requirement: format!("one per sequence of the batch ({})", shape.batch),
        });
    }
    match *kv {
        KvCache::Contiguous { max_seqlen_k } => {
            if let Some((b, &len)) = seqlens_k
                .iter()
                .enumerate()
                .find(|(_, &l)| l > max_seqlen_k)
            {
                return Err(ViewError::Length {
                    what: format!("seqlens_k[{b}]"),
                    got: len,
                    requirement: format!("at most max_seqlen_k = {max_seqlen_k}"),
                });
            }
        }
        KvCache::Paged {
            page_size,
            num_pages,
            max_pages,
            page_table,
        } => {
            if !PAGE_SIZES.contains(&page_size) {
                return Err(ViewError::PageSize {
                    got: page_size,
                    supported: PAGE_SIZES.to_vec(),
                });
            }
            if num_pages.saturating_mul(page_size) > MAX_POOL_ROWS {
                return Err(ViewError::Length {
                    what: "num_pages * page_size (token rows of the pool)".into(),
                    got: num_pages.saturating_mul(page_size),
                    requirement: format!("at most {MAX_POOL_ROWS}"),
                });
            }
            if max_pages == 0 || shape.batch.checked_mul(max_pages) != Some(page_table.len()) {
                return Err(ViewError::PageTableLength {
                    got: page_table.len(),
                    batch: shape.batch,
                    max_pages,
                });
            }
            // what one sequence's table covers; `DecodePlan::new` takes it as max_seqlen_k
            let Some(capacity) = max_pages.checked_mul(page_size) else {
                return Err(ViewError::Length {
                    what: "max_pages * page_size (tokens one sequence's page table covers)".into(),
                    got: max_pages,
                    requirement: format!(
                        "max_pages at most {} with pages of {page_size} tokens",
                        usize::MAX / page_size
                    ),
                });
            };
            for (b, &len) in seqlens_k.iter().enumerate() {
                if len > capacity {
                    return Err(ViewError::SequenceLongerThanPages {
                        sequence: b,
                        len,
                        max_pages,
                        page_size,
                    });
                }
                let row = &page_table[b * max_pages..][..len.div_ceil(page_size)];
                if let Some(i) = row.iter().position(|&p| p < 0 || p as usize >= num_pages) {
                    return Err(ViewError::PageOutOfPool {
                        sequence: b,
                        slot: i,
                        page: row[i],
                        num_pages,
                    });
                }
            }
        }
    }
    Ok(())
}

impl DecodePlan {
    /// Plans one decode step of `shape` over sequences of `seqlens_k` keys (counting this step's
    /// `new_tokens`) with K/V in `kv`, for the device `caps` describe. Pure host work.
    ///
    /// [`DecodeStep::append`] writes token `i` of sequence `b` of its `[batch, new_tokens, ..]`
    /// input to position `max(seqlens_k[b] - new_tokens, 0) + i` while that is below
    /// `seqlens_k[b]`: the last `new_tokens` positions of a decode step, or, with `new_tokens`
    /// the padded prompt length, a whole ragged prompt written into the cache.
    pub fn new(
        shape: &DecodeShape,
        caps: &DeviceCaps,
        seqlens_k: &[usize],
        kv: KvCache<'_>,
        new_tokens: usize,
        schedule: LeanSchedule,
    ) -> Result<DecodePlan> {
        validate_lengths(shape, seqlens_k, &kv)?;
        let max_seqlen_k = match kv {
            KvCache::Contiguous { max_seqlen_k } => max_seqlen_k,
            KvCache::Paged {
                page_size,
                max_pages,
                ..
            } => page_size * max_pages, // validate_lengths refused an overflowing product
        };
        let mut p = AttentionProblem::uniform(
            shape.batch,
            shape.query_len,
            max_seqlen_k,
            shape.heads_q,
            shape.heads_kv,
            shape.head_dim,
            shape.head_dim,
            shape.dtype,
        );
        p.seqlens_k = seqlens_k.to_vec();
        p.causal = shape.causal;
        p.kv_layout = KvLayout::Separate;
        if let Some(s) = shape.softmax_scale {
            p.softmax_scale = s;
        }
        let lp = match schedule {
            LeanSchedule::StreamK => match kv {
                KvCache::Contiguous { .. } => lean::plan(&p, caps)?,
                KvCache::Paged { .. } => lean::plan_paged(&p, caps)?,
            },
            LeanSchedule::FixedSplit(splits) => lean::plan_fixed_split(&p, caps, splits)?,
        };
        let storage = match kv {
            KvCache::Contiguous { .. } => KvStorage::Contiguous,
            KvCache::Paged {
                page_size,
                num_pages,
                max_pages,
                page_table,
            } => KvStorage::Paged(Paging::new(
                page_size,
                num_pages,
                max_pages,
                page_table.to_vec(),
                seqlens_k,
            )?),
        };
        Ok(DecodePlan {
            shape: *shape,
            step: LeanStepPlan::new(&p, &lp, storage, new_tokens)?,
        })
    }

    /// Workspace bytes that serve every stream-K step of `shape` on the device `caps` describe
    /// with at most `max_pages` page-table entries per sequence (0 for contiguous K/V): the
    /// stream-K grid never exceeds `compute_units * ctas_per_unit` CTAs. Allocate this once.
    pub fn stream_k_workspace_bound(
        shape: &DecodeShape,
        caps: &DeviceCaps,
        max_pages: usize,
    ) -> Result<usize> {
        let tile_m = (shape.heads_q / shape.heads_kv.max(1))
            .saturating_mul(shape.query_len)
            .min(lean::MAX_TILE_M);
        let rows = ferrattn_cuda::kernels::lean_rows(tile_m.max(1))?;
        // every region of the layout, counted in u128 with its alignment padding: when this
        // fits a usize, none of the layout's usize sums and products can overflow
        let (batch, ctas, pages) = (
            shape.batch as u128,
            caps.compute_units as u128 * caps.ctas_per_unit.max(1) as u128,
            shape.batch as u128 * max_pages as u128,
        );
        let words = 3 * batch
            + (batch + 1)
            + (ctas + 1)
            + ferrattn_cuda::launch::CTA_INFO_WORDS as u128 * ctas
            + pages
            + if max_pages > 0 {
                ferrattn_cuda::launch::CTA_WORDS_MAX as u128 * ctas
            } else {
                0
            }
            + ctas
            + ctas * rows as u128 * shape.head_dim as u128
            + ctas * rows as u128 * 2;
        let bytes = 4 * words + 11 * ferrattn_cuda::launch::WORKSPACE_ALIGN as u128;
        if bytes > isize::MAX as u128 {
            return Err(ferrattn_core::CoreError::TooLarge {
                what: format!(
                    "a stream-K workspace for batch {}, head_dim {}, {} CTAs ({} units x {}) and {max_pages} pages per sequence",
                    shape.batch, shape.head_dim, ctas, caps.compute_units, caps.ctas_per_unit
                ),
                bytes_needed: bytes,
                available: format!("at most {} bytes fit in one allocation", isize::MAX),
            }
            .into());
        }
        Ok(WorkspaceLayout::bound(
            shape.batch,
            ctas as usize,
            rows,
            shape.head_dim,
            pages as usize,
        ))
    }

    /// Workspace bytes the step needs (allocate once for the largest step, 256-byte aligned).
    pub fn workspace_bytes(&self) -> usize {
        self.step.workspace_bytes()
    }

    /// The shapes.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }

    /// The backend's launch plan (schedule tables, workspace layout).
    pub fn step(&self) -> &LeanStepPlan {
        &self.step
    }

    /// The plan as JSON (to inspect a schedule or reproduce a run).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("plans serialise")
    }

    /// Whether a graph captured from this plan's launches may run with `other`'s tables in the
    /// workspace: the same kernel instance, grid, tiling, batch, K/V extent and page-table
    /// shape, so every offset and grid size the graph holds is the one `other` needs (its
    /// lengths and page table, which the kernels read from the workspace, may differ).
    pub fn same_launch(&self, other: &DecodePlan) -> bool {
        let (a, b) = (&self.step, &other.step);
        let (pa, pb) = (a.problem(), b.problem());
        let kv = match (a.kv(), b.kv()) {
            (KvStorage::Contiguous, KvStorage::Contiguous) => true,
            (KvStorage::Paged(x), KvStorage::Paged(y)) => {
                (x.page_size(), x.num_pages(), x.max_pages())
                    == (y.page_size(), y.num_pages(), y.max_pages())
            }
            _ => false,
        };
        kv && self.shape == other.shape
            && a.instance() == b.instance()
            && a.num_ctas() == b.num_ctas()
            && a.layout() == b.layout()
            && a.new_tokens() == b.new_tokens()
            && pa.max_seqlen_k == pb.max_seqlen_k
            && pa.softmax_scale == pb.softmax_scale
            && (
                a.lean_plan().tile_k,
                a.lean_plan().tile_m,
                a.lean_plan().query_groups,
            ) == (
                b.lean_plan().tile_k,
                b.lean_plan().tile_m,
                b.lean_plan().query_groups,
            )
            && a.lean_plan().schedule.merges_in_kernel()
                == b.lean_plan().schedule.merges_in_kernel()
    }

    /// A plan read back from [`DecodePlan::to_json`]'s output, checked again.
    pub fn from_json(json: &str) -> Result<DecodePlan> {
        serde_json::from_str(json).map_err(|e| FerrattnError::PlanMismatch(e.to_string()))
    }
}

/// The tensors of one layer's decode.
#[derive(Clone, Copy, Debug)]
pub struct DecodeViews<'v, 'a> {
    /// `[batch, query_len, heads_q, head_dim]`.
    pub q: &'v TensorView<'a>,
    /// `[batch, max_seqlen_k, heads_kv, head_dim]`, or paged `[num_pages, page_size, heads_kv,
    /// head_dim]`.
    pub k: &'v TensorView<'a>,
    /// As `k`.
    pub v: &'v TensorView<'a>,
    /// Output, as `q`.
    pub o: &'v TensorView<'a>,
    /// Output `f32 [batch, heads_q, query_len]`, natural log (as flash-attn returns it).
    pub lse: &'v TensorView<'a>,
}

/// Checks one view: rank, shape, dtype, device, declared length, contiguity, alignment.
fn check_view(
    tensor: &'static str,
    x: &TensorView<'_>,
    expected: &[usize],
    layout: &'static str,
    dtype: DType,
    location: Location,
) -> std::result::Result<(), ViewError> {
    if x.shape.len() != expected.len() {
        return Err(ViewError::Rank {
            tensor,
            shape: x.shape.clone(),
            got: x.shape.len(),
            expected: expected.len(),
            layout,
        });
    }
    if x.shape != expected {
        return Err(ViewError::Shape {
            tensor,
            got: x.shape.clone(),
            expected: expected.to_vec(),
            layout,
        });
    }
    if x.dtype != dtype {
        return Err(ViewError::DType {
            tensor,
            got: x.dtype,
            expected: dtype,
        });
    }
    if x.location != location {
        return Err(ViewError::Device {
            tensor,
            got: x.location,
            expected: location,
        });
    }
    if !x.is_contiguous() {
        return Err(ViewError::NotContiguous {
            tensor,
            shape: x.shape.clone(),
            got: x.strides.clone(),
            expected: contiguous_strides(&x.shape),
        });
    }
    let needed = x.extent_bytes();
    if needed > x.bytes {
        return Err(ViewError::ShortBuffer {
            tensor,
            needed,
            declared: x.bytes,
            shape: x.shape.clone(),
            strides: x.strides.clone(),
        });
    }
    if !x.addr.is_multiple_of(TENSOR_ALIGN) {
        return Err(ViewError::Misaligned {
            tensor,
            addr: x.addr,
            align: TENSOR_ALIGN,
        });
    }
    Ok(())
}

/// The boundary check of one layer's decode: every view of `x` against `plan`, all on
/// `location`. Runs on the host only; nothing is read through the views.
pub fn validate(
    plan: &DecodePlan,
    x: &DecodeViews<'_, '_>,
    location: Location,
) -> std::result::Result<(), ViewError> {
    let s = &plan.shape;
    let (b, sq, hq, d) = (s.batch, s.query_len, s.heads_q, s.head_dim);
    const QL: &str = "[batch, query_len, heads_q, head_dim]";
    check_view("q", x.q, &[b, sq, hq, d], QL, s.dtype, location)?;
    let (kv_shape, kv_layout) = kv_shape(plan);
    check_view("k", x.k, &kv_shape, kv_layout, s.dtype, location)?;
    check_view("v", x.v, &kv_shape, kv_layout, s.dtype, location)?;
    check_view("o", x.o, &[b, sq, hq, d], QL, s.dtype, location)?;
    check_view(
        "lse",
        x.lse,
        &[b, hq, sq],
        "[batch, heads_q, query_len], f32",
        DType::F32,
        location,
    )
}

fn kv_shape(plan: &DecodePlan) -> ([usize; 4], &'static str) {
    let s = &plan.shape;
    match plan.step.kv() {
        KvStorage::Contiguous => (
            [
                s.batch,
                plan.step.problem().max_seqlen_k,
                s.heads_kv,
                s.head_dim,
            ],
            "[batch, max_seqlen_k, heads_kv, head_dim]",
        ),
        KvStorage::Paged(pg) => (
            [pg.num_pages(), pg.page_size(), s.heads_kv, s.head_dim],
            "[num_pages, page_size, heads_kv, head_dim]",
        ),
    }
}

fn check_workspace(
    plan: &DecodePlan,
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
    if w.bytes < plan.workspace_bytes() {
        return Err(ViewError::Workspace {
            needed: plan.workspace_bytes(),
            declared: w.bytes,
        });
    }
    if !w.addr.is_multiple_of(WORKSPACE_ALIGN as u64) {
        return Err(ViewError::Misaligned {
            tensor: "workspace",
            addr: w.addr,
            align: WORKSPACE_ALIGN as u64,
        });
    }
    Ok(())
}

/// Lean decode on one CUDA device through caller-owned memory and streams.
#[derive(Debug)]
pub struct LeanDecoder {
    backend: CudaBackend,
    ordinal: usize,
    /// The state-merge kernels of f16 and bf16, loaded at first use ([`LeanDecoder::merge_states`]).
    merge: [std::sync::OnceLock<std::result::Result<ferrattn_cuda::cp::CpKernels, String>>; 2],
}

impl LeanDecoder {
    /// The decoder of CUDA device `ordinal` (kernels load at first use).
    pub fn new(ordinal: usize) -> Result<LeanDecoder> {
        let backend = CudaBackend::new(ordinal);
        backend.gpu()?;
        Ok(LeanDecoder {
            backend,
            ordinal,
            merge: Default::default(),
        })
    }

    /// What the planner needs to know of the device.
    pub fn caps(&self) -> Result<DeviceCaps> {
        Ok(self.backend.gpu()?.caps.clone())
    }

    /// Starts a step: checks the workspace, resolves the step's kernels (cached per instance)
    /// and enqueues the copy of its tables into the workspace on `stream`. Call it outside a
    /// graph capture, once per step, before the layers' [`DecodeStep::run`].
    ///
    /// A CUDA graph captured from one step's launches may be replayed after a later step began
    /// in the same workspace only when [`DecodePlan::same_launch`] holds for the two plans (the
    /// graph keeps the first plan's grid and sizes; the tables come from the workspace).
    pub fn begin_step<'p, 'w>(
        &self,
        plan: &'p DecodePlan,
        workspace: &'w mut Workspace,
        stream: Stream,
    ) -> Result<DecodeStep<'p, 'w>> {
        check_workspace(plan, workspace, self.ordinal)?;
        let kernels = self.backend.lean_kernels(plan.step.instance())?;
        // SAFETY: the workspace was checked (device, size, alignment) and the caller promised
        // it is device memory that nothing else uses (Workspace::cuda); the stream by
        // Stream::from_raw.
        unsafe {
            kernels.upload(&plan.step, workspace.addr, stream.as_raw() as _)?;
        }
        Ok(DecodeStep {
            plan,
            kernels,
            workspace: workspace.addr,
            ordinal: self.ordinal,
            _workspace: PhantomData,
        })
    }
}

/// A step whose tables are in the workspace: launches per layer. It holds the workspace's
/// mutable borrow, so the tables stay this step's while it lives.
#[derive(Debug)]
pub struct DecodeStep<'p, 'w> {
    plan: &'p DecodePlan,
    kernels: Arc<LeanKernels>,
    workspace: u64,
    ordinal: usize,
    _workspace: PhantomData<&'w mut Workspace>,
}

impl DecodeStep<'_, '_> {
    /// Validates one layer's views and enqueues its decode on `stream` (which must be ordered
    /// after the stream the step began on). No allocation, synchronisation or copy.
    pub fn run(&self, x: &DecodeViews<'_, '_>, stream: Stream) -> Result<()> {
        validate(self.plan, x, Location::Cuda(self.ordinal))?;
        let t = LeanTensors {
            q: x.q.addr,
            k: x.k.addr,
            v: x.v.addr,
            o: x.o.addr,
            lse: x.lse.addr,
        };
        // SAFETY: every view was checked against the plan above (shape, dtype, device, length,
        // contiguity, alignment); the page table against the pool when the plan was made; the
        // workspace and its tables by begin_step.
        unsafe {
            self.kernels
                .run(&self.plan.step, &t, self.workspace, stream.as_raw() as _)?;
        }
        Ok(())
    }

    /// Validates and enqueues the copy of one layer's new tokens (`k_new`, `v_new`:
    /// `[batch, new_tokens, heads_kv, head_dim]`) into its cache `k`, `v` on `stream`.
    pub fn append(
        &self,
        k_new: &TensorView<'_>,
        v_new: &TensorView<'_>,
        k: &TensorView<'_>,
        v: &TensorView<'_>,
        stream: Stream,
    ) -> Result<()> {
        let s = &self.plan.shape;
        let at = Location::Cuda(self.ordinal);
        let new = [s.batch, self.plan.step.new_tokens(), s.heads_kv, s.head_dim];
        const NL: &str = "[batch, new_tokens, heads_kv, head_dim]";
        check_view("k_new", k_new, &new, NL, s.dtype, at)?;
        check_view("v_new", v_new, &new, NL, s.dtype, at)?;
        let (kv_shape, kv_layout) = kv_shape(self.plan);
        check_view("k", k, &kv_shape, kv_layout, s.dtype, at)?;
        check_view("v", v, &kv_shape, kv_layout, s.dtype, at)?;
        // SAFETY: as in run: views checked, tables in the workspace.
        unsafe {
            self.kernels.append(
                &self.plan.step,
                (k_new.addr, v_new.addr),
                (k.addr, v.addr),
                self.workspace,
                stream.as_raw() as _,
            )?;
        }
        Ok(())
    }
}

impl From<ViewError> for FerrattnError {
    fn from(e: ViewError) -> FerrattnError {
        FerrattnError::View(e)
    }
}
