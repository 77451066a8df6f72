//! Context-parallel decode on several GPUs: Lean over each rank's slice of the keys, the partial
//! `(O, LSE)` exchanged over NCCL, merged by `cuda-kernels/cp_merge.cu`.
//!
//! The plan is `ferrattn_core::cp::CpPlan` (pure, host): who holds which keys, all-gather or
//! reduce-scatter by heads, the merge order. [`CpRank`] is one rank: its communicator, the Lean
//! kernels of the shape and the merge kernels. Per step, [`CpRank::plan_step`] makes the rank's
//! [`CpStepPlan`] (its local Lean step over the keys it holds, contiguous or paged, and the
//! workspace layout); [`CpRank::upload`] copies the Lean tables once; [`CpRank::run`] enqueues,
//! on the caller's stream, with no allocation and no host synchronisation:
//!
//! 1. [`CpRank::attend`]: Lean over the local slice (the existing device path, kernel unchanged),
//!    writing this rank's partial into its block of the workspace; a rank with no keys at all
//!    only sets its LSE to `-inf` (an empty partial, which merges to nothing);
//! 2. [`CpRank::exchange`]: all-gather of the blocks in place, or all-reduce (max) of LSE, the
//!    scaling pass and a reduce-scatter (sum) by heads;
//! 3. [`CpRank::merge`]: the merge kernel (core's `SoftmaxState::merge`, Lean appendix D) or the
//!    finishing pass, writing O and LSE of the heads the plan gives this rank to the caller's
//!    buffers.
//!
//! NCCL collectives and cooperative kernels both capture into CUDA graphs, so a whole step can
//! be captured and replayed (every rank captures its own).
//!
//! Partials travel in the cache dtype (as engines exchange them: half the bytes of f32), so
//! the result differs from single-GPU Lean over the whole cache by the rounding of each partial
//! O to that dtype plus the f32 rounding of the merge order; see `docs/CONTEXT_PARALLEL.md`.
//!
//! TurboAttention and TurboQuant decode write O `[B, Sq, Hq, D]` (16-bit) and LSE
//! `[B, Hq, Sq]` in this same layout, so [`CpRank::exchange`] and [`CpRank::merge`] take
//! their partials unchanged (write them into [`CpRank::partial_block`]); a step whose local
//! decode is one of those runs them in place of [`CpRank::attend`].

use crate::device::Gpu;
use crate::error::{check, CudaError, Result};
use crate::kernels::{self, Function, LeanInstance};
use crate::launch::{launch_on, KvStorage, LeanKernels, LeanStepPlan, LeanTensors};
use crate::nccl::{Communicator, Element, Reduce};
use crate::turbo::device::{TurboDecodeStepPlan, TurboStepKernels};
use crate::turbo::DeviceTurboCache;
use crate::turboquant::{DeviceTurboQuantCache, PreparedTurboQuantDecode, TurboQuantCuda};
use crate::CudaBackend;
use cudarc::driver::sys;
use ferrattn_core::cp::{CpPlan, CpShape, Exchange, MAX_RANKS};
use ferrattn_core::turbo::TurboConfig;
use ferrattn_core::{lean, AttentionProblem, DType};
use std::sync::Arc;

const ALIGN: usize = crate::launch::WORKSPACE_ALIGN;
const THREADS: u32 = 128;

/// Mirrors `struct CpMergeParams` in `cuda-kernels/cp_merge.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct MergeParams {
    part_o: u64,
    part_lse: u64,
    o: u64,
    lse: u64,
    o_stride: u64,
    lse_stride: u64,
    ranks: i32,
    batch: i32,
    sq: i32,
    hq: i32,
    d: i32,
    h0: i32,
    nh: i32,
    reserved: i32,
    order: [i32; MAX_RANKS],
}

/// Mirrors `struct CpScaleParams`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ScaleParams {
    part: u64,
    gmax: u64,
    scaled: u64,
    lse_offset: u64,
    batch: i32,
    sq: i32,
    hq: i32,
    d: i32,
}

/// Mirrors `struct CpFinishParams`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct FinishParams {
    summed: u64,
    gmax: u64,
    o: u64,
    lse: u64,
    batch: i32,
    sq: i32,
    hq: i32,
    d: i32,
    h0: i32,
    nh: i32,
}

/// The merge kernels of one dtype, resolved once.
#[derive(Debug)]
pub struct CpKernels {
    merge: Function,
    scale: Function,
    finish: Function,
}

impl CpKernels {
    /// Loads `cp_merge` on `gpu` and resolves the entry points of `dtype` (f16 or bf16).
    pub fn load(gpu: &Arc<Gpu>, dtype: DType, force_nvrtc: bool) -> Result<CpKernels> {
        let dt = match dtype {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            other => {
                return Err(CudaError::Unsupported {
                    what: format!("{other} partials for the context-parallel merge"),
                    supported: "f16, bf16".into(),
                })
            }
        };
        let img = kernels::image("cp_merge").expect("cp_merge is embedded by build.rs");
        let m = kernels::Module::load(gpu, img, force_nvrtc)?;
        Ok(CpKernels {
            merge: m.function(&format!("cp_merge_{dt}"))?,
            scale: m.function(&format!("cp_scale_{dt}"))?,
            finish: m.function(&format!("cp_finish_{dt}"))?,
        })
    }
}

/// Partials of every rank, gathered by anyone (this crate's NCCL exchange, or a framework's
/// collective such as `torch.distributed.all_gather_into_tensor`): rank `r`'s O
/// `[B, Sq, Hq, D]` (16-bit) at `o + r * o_stride` bytes and its LSE `[B, Hq, Sq]` (f32, natural
/// log, `-inf` for an empty slice) at `lse + r * lse_stride` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatheredPartials {
    /// Device address of rank 0's O.
    pub o: u64,
    /// Bytes from one rank's O to the next.
    pub o_stride: u64,
    /// Device address of rank 0's LSE.
    pub lse: u64,
    /// Bytes from one rank's LSE to the next.
    pub lse_stride: u64,
}

impl CpKernels {
    /// Enqueues the merge of `parts` (ranks folded in `order`, a permutation of `0..ranks`)
    /// into O `[B, Sq, heads.1, D]` at `out.0` and LSE `[B, heads.1, Sq]` at `out.1`, for heads
    /// `heads.0 ..` of `shape`, on `stream`. Checks the order, the heads and the head dim.
    ///
    /// # Safety
    /// Every address is device memory of `gpu` holding the shapes above, 2-byte aligned (O) and
    /// 4-byte aligned (LSE); `stream` belongs to `gpu`'s context.
    #[allow(clippy::too_many_arguments)] // one argument per tensor group, as the kernel takes them
    pub unsafe fn merge_gathered(
        &self,
        gpu: &Arc<Gpu>,
        shape: &CpShape,
        parts: &GatheredPartials,
        order: &[usize],
        heads: (usize, usize),
        out: (u64, u64),
        stream: sys::CUstream,
    ) -> Result<()> {
        let ranks = order.len();
        let mut seen = [false; MAX_RANKS];
        if ranks == 0
            || ranks > MAX_RANKS
            || order
                .iter()
                .any(|&r| r >= ranks || std::mem::replace(&mut seen[r], true))
        {
            return Err(CudaError::Plan(format!(
                "merge order {order:?} is not a permutation of 0..{ranks} (1 to {MAX_RANKS} ranks)"
            )));
        }
        if heads.0 + heads.1 > shape.heads_q || shape.head_dim > 256 || shape.head_dim == 0 {
            return Err(CudaError::Plan(format!(
                "output heads {}..{} of {} with head dim {} (at most 256)",
                heads.0,
                heads.0 + heads.1,
                shape.heads_q,
                shape.head_dim
            )));
        }
        let mut ord = [0i32; MAX_RANKS];
        for (dst, &r) in ord.iter_mut().zip(order) {
            *dst = r as i32;
        }
        let mut prm = MergeParams {
            part_o: parts.o,
            part_lse: parts.lse,
            o: out.0,
            lse: out.1,
            o_stride: parts.o_stride,
            lse_stride: parts.lse_stride,
            ranks: ranks as i32,
            batch: shape.batch as i32,
            sq: shape.seqlen_q as i32,
            hq: shape.heads_q as i32,
            d: shape.head_dim as i32,
            h0: heads.0 as i32,
            nh: heads.1 as i32,
            reserved: 0,
            order: ord,
        };
        let rows = shape.batch * shape.seqlen_q * heads.1;
        unsafe { launch_rows(gpu, &self.merge, rows, &mut prm, stream) }
    }
}

/// Enqueues `f` with one warp per row.
///
/// # Safety
/// `P` is `f`'s parameter struct (repr(C), mirrored in cp_merge.cu) with valid addresses.
unsafe fn launch_rows<P>(
    gpu: &Arc<Gpu>,
    f: &Function,
    rows: usize,
    prm: &mut P,
    stream: sys::CUstream,
) -> Result<()> {
    if rows == 0 {
        return Ok(());
    }
    let grid = (rows * 32).div_ceil(THREADS as usize) as u32;
    let mut args = [prm as *mut P as *mut std::ffi::c_void];
    unsafe { launch_on(gpu, f, (grid, THREADS), 0, stream, false, &mut args) }
}

/// Byte offsets of one rank's workspace (every region 256-byte aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CpLayout {
    /// The local Lean step's workspace, at 0.
    pub lean_bytes: usize,
    /// Partial blocks: `ranks` of them (all-gather) or this rank's alone (reduce-scatter).
    pub parts: usize,
    /// Bytes of one block: O `[B, Sq, Hq, D]` in the dtype, then LSE at `lse_offset`.
    pub block_bytes: usize,
    /// LSE `[B, Hq, Sq]` f32 within a block.
    pub lse_offset: usize,
    /// Reduce-scatter only: all-reduced max LSE `[B, Hq, Sq]` f32.
    pub gmax: usize,
    /// Reduce-scatter only: scaled numerators and weights `[Hq][B][Sq][D + 1]` f32.
    pub scaled: usize,
    /// Reduce-scatter only: this rank's summed heads `[Hq / R][B][Sq][D + 1]` f32.
    pub summed: usize,
    /// Total bytes.
    pub total: usize,
}

/// One rank's step: the plan, the local Lean step (none when the rank holds no key) and the
/// workspace layout. Fields are private: nothing that feeds an offset changes after the checks.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CpStepPlan {
    plan: CpPlan,
    rank: usize,
    local: Option<LeanStepPlan>,
    layout: CpLayout,
}

impl CpStepPlan {
    /// The plan.
    pub fn plan(&self) -> &CpPlan {
        &self.plan
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The local Lean step (`None`: this rank holds no key of any sequence).
    pub fn local(&self) -> Option<&LeanStepPlan> {
        self.local.as_ref()
    }

    /// The workspace layout.
    pub fn layout(&self) -> &CpLayout {
        &self.layout
    }

    /// Workspace bytes the step needs (256-byte aligned device memory).
    pub fn workspace_bytes(&self) -> usize {
        self.layout.total
    }

    /// Output heads of this rank: `(first, count)`.
    pub fn output_heads(&self) -> (usize, usize) {
        self.plan.output_heads(self.rank)
    }
}

/// Device addresses of one rank's tensors: Q `[B, Sq, Hq, D]` (every rank holds the whole
/// query), the local K/V (contiguous `[B, max_local_k, Hkv, D]` or the page pools), and the
/// outputs of the heads the plan gives this rank: O `[B, Sq, nh, D]`, LSE f32 `[B, nh, Sq]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpTensors {
    /// Q.
    pub q: u64,
    /// Local K (or its page pool).
    pub k: u64,
    /// Local V (or its page pool).
    pub v: u64,
    /// O of this rank's output heads.
    pub o: u64,
    /// LSE of this rank's output heads.
    pub lse: u64,
}

/// One rank of a context-parallel decode: communicator, Lean kernels of the shape, merge kernels.
#[derive(Debug)]
pub struct CpRank {
    comm: Arc<Communicator>,
    shape: CpShape,
    lean: Arc<LeanKernels>,
    kernels: CpKernels,
}

impl CpRank {
    /// Rank `comm.rank()` for decodes of `shape`, on `backend`'s GPU (which must be the
    /// communicator's). One communicator serves any number of shapes.
    pub fn new(backend: &CudaBackend, comm: Arc<Communicator>, shape: &CpShape) -> Result<CpRank> {
        let gpu = backend.gpu()?;
        if !Arc::ptr_eq(gpu, comm.gpu()) {
            return Err(CudaError::Plan(format!(
                "the communicator's rank {} is on GPU {} but the backend is GPU {}",
                comm.rank(),
                comm.gpu().ordinal,
                gpu.ordinal
            )));
        }
        if shape.head_dim > 256 {
            return Err(CudaError::Unsupported {
                what: format!("head dim {} for the context-parallel merge", shape.head_dim),
                supported: "at most 256".into(),
            });
        }
        let rows = (shape.heads_q / shape.heads_kv.max(1)) * shape.seqlen_q;
        let instance = LeanInstance::new(shape.dtype, shape.head_dim, rows.min(lean::MAX_TILE_M))?;
        Ok(CpRank {
            kernels: CpKernels::load(gpu, shape.dtype, backend.options().force_nvrtc)?,
            lean: backend.lean_kernels(instance)?,
            shape: shape.clone(),
            comm,
        })
    }

    /// The merge kernels (for partials gathered by another transport).
    pub fn kernels(&self) -> &CpKernels {
        &self.kernels
    }

    /// The communicator.
    pub fn comm(&self) -> &Communicator {
        &self.comm
    }

    /// This rank's step of `plan`: K/V of its slices in `kv` (contiguous with `max_local_k`
    /// positions per sequence, or paged), the local Lean schedule planned for this GPU.
    pub fn plan_step(
        &self,
        plan: &CpPlan,
        kv: KvStorage,
        max_local_k: usize,
    ) -> Result<CpStepPlan> {
        let rank = self.comm.rank();
        ferrattn_core::cp::check(plan)?;
        if plan.ranks != self.comm.size() || plan.request.shape != self.shape {
            return Err(CudaError::Plan(format!(
                "a plan for {} ranks and shape {:?} was given to rank {rank} of {} made for {:?}",
                plan.ranks,
                plan.request.shape,
                self.comm.size(),
                self.shape
            )));
        }
        let s = &self.shape;
        let lens = plan.local_lens(rank);
        let longest = lens.iter().copied().max().unwrap_or(0);
        if longest > max_local_k && kv == KvStorage::Contiguous {
            return Err(CudaError::Plan(format!(
                "rank {rank} holds {longest} keys of one sequence but its K/V has {max_local_k} positions"
            )));
        }
        let local = if longest == 0 {
            None
        } else {
            let mut p = AttentionProblem::uniform(
                s.batch,
                s.seqlen_q,
                max_local_k.max(longest),
                s.heads_q,
                s.heads_kv,
                s.head_dim,
                s.head_dim,
                s.dtype,
            );
            p.seqlens_k = lens;
            p.causal = s.causal;
            p.validate()?;
            let caps = &self.comm.gpu().caps;
            let lp = match kv {
                KvStorage::Contiguous => lean::plan(&p, caps)?,
                KvStorage::Paged(_) => lean::plan_paged(&p, caps)?,
            };
            Some(LeanStepPlan::new(&p, &lp, kv, 0)?)
        };
        let rows = s.rows();
        let mut at = local.as_ref().map_or(0, |l| l.workspace_bytes());
        let mut region = |bytes: usize| {
            let off = at.next_multiple_of(ALIGN);
            at = off + bytes;
            off
        };
        let lse_offset = (rows * s.head_dim * s.dtype.size_bytes()).next_multiple_of(ALIGN);
        let block_bytes = (lse_offset + rows * 4).next_multiple_of(ALIGN);
        let rs = plan.exchange == Exchange::ReduceScatterHeads;
        let blocks = if rs { 1 } else { plan.ranks };
        let parts = region(blocks * block_bytes);
        let (gmax, scaled, summed) = if rs {
            let row = (s.head_dim + 1) * 4;
            (
                region(rows * 4),
                region(rows * row),
                region(rows / plan.ranks * row),
            )
        } else {
            (0, 0, 0)
        };
        let total = region(0);
        Ok(CpStepPlan {
            plan: plan.clone(),
            rank,
            layout: CpLayout {
                lean_bytes: local.as_ref().map_or(0, |l| l.workspace_bytes()),
                parts,
                block_bytes,
                lse_offset,
                gmax,
                scaled,
                summed,
                total,
            },
            local,
        })
    }

    /// Copies the local Lean step's tables into the workspace on `stream` (once per step).
    ///
    /// # Safety
    /// `workspace` is device memory of this rank's GPU of at least `step.workspace_bytes()`
    /// bytes, 256-byte aligned, not in use by a launch still running; `stream` belongs to the
    /// GPU's context.
    pub unsafe fn upload(
        &self,
        step: &CpStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        match &step.local {
            Some(l) => unsafe { self.lean.upload(l, workspace, stream) },
            None => Ok(()),
        }
    }

    fn check(&self, step: &CpStepPlan) -> Result<()> {
        if step.rank != self.comm.rank() || step.plan.request.shape != self.shape {
            return Err(CudaError::Plan(format!(
                "a step planned for rank {} was given to rank {}",
                step.rank,
                self.comm.rank()
            )));
        }
        Ok(())
    }

    /// The partial of a rank with no key: LSE `-inf` on every row (the merge never reads its O).
    ///
    /// # Safety
    /// `lse` holds `shape.rows()` f32 on this rank's GPU; `stream` is a stream of its context.
    unsafe fn write_empty_partial(&self, lse: u64, stream: sys::CUstream) -> Result<()> {
        let _bound = self.comm.gpu().bind()?;
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(lse, f32::NEG_INFINITY.to_bits(), self.shape.rows(), stream)
        })
    }

    /// Address of this rank's partial block in `workspace`: O `[B, Sq, Hq, D]` at it, LSE
    /// `[B, Hq, Sq]` f32 at `+ layout().lse_offset`. Any decode that writes its partial here
    /// (Lean, TurboAttention, TurboQuant) is merged by [`CpRank::exchange`] and [`CpRank::merge`].
    pub fn partial_block(&self, step: &CpStepPlan, workspace: u64) -> u64 {
        let l = &step.layout;
        let slot = if step.plan.exchange == Exchange::AllGather {
            step.rank
        } else {
            0
        };
        workspace + (l.parts + slot * l.block_bytes) as u64
    }

    /// Enqueues the whole step on `stream`: [`CpRank::attend`], [`CpRank::exchange`],
    /// [`CpRank::merge`]. Every rank calls it (NCCL collectives wait for all ranks).
    ///
    /// # Safety
    /// [`CpRank::upload`] of `step` into `workspace` was enqueued before on `stream`; `t` holds
    /// device addresses of this GPU, 16-byte aligned, of the shapes [`CpTensors`] names.
    pub unsafe fn run(
        &self,
        step: &CpStepPlan,
        t: &CpTensors,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        unsafe {
            self.attend(step, t, workspace, stream)?;
            self.exchange(step, workspace, stream)?;
            self.merge(step, t, workspace, stream)
        }
    }

    /// Lean over the local slice into this rank's partial block.
    ///
    /// # Safety
    /// As for [`CpRank::run`].
    pub unsafe fn attend(
        &self,
        step: &CpStepPlan,
        t: &CpTensors,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        let block = self.partial_block(step, workspace);
        let lse = block + step.layout.lse_offset as u64;
        match &step.local {
            Some(l) => {
                let lt = LeanTensors {
                    q: t.q,
                    k: t.k,
                    v: t.v,
                    o: block,
                    lse,
                };
                unsafe { self.lean.run(l, &lt, workspace, stream) }
            }
            // SAFETY: lse is this rank's partial block's LSE, as the caller promises
            None => unsafe { self.write_empty_partial(lse, stream) },
        }
    }

    /// TurboAttention decode (Alg. 2) of this rank's slice into its partial block, in place of
    /// [`CpRank::attend`]: `cache` is the compressed cache of this rank's keys of every
    /// sequence (built by its own prefill and appends, on 64-token block boundaries:
    /// [`ferrattn_core::cp::split_by_bandwidth`] with `align = 64` keeps them there), `plan` a
    /// [`TurboDecodeStepPlan::slice`] over the CP plan's local lengths, uploaded into
    /// `turbo_workspace` ([`TurboStepKernels::upload_decode`]). A sequence with no key here
    /// gives an empty row (LSE `-inf`), which [`CpRank::merge`] skips; a rank with no key at all
    /// writes only `-inf`. The partials merge like Lean's: TurboAttention's O is normalised and
    /// its LSE in natural log, in the Lean layout.
    ///
    /// # Safety
    /// As for [`CpRank::run`] for `q` and `workspace`; `turbo_workspace` as for
    /// [`TurboStepKernels::decode`], with `plan`'s tables uploaded on `stream` (or before it).
    #[allow(clippy::too_many_arguments)] // the decode's own settings beside the CP step's
    pub unsafe fn attend_turbo(
        &self,
        step: &CpStepPlan,
        turbo: &TurboStepKernels,
        plan: &TurboDecodeStepPlan,
        cfg: &TurboConfig,
        q: u64,
        softmax_scale: f32,
        cache: &DeviceTurboCache,
        workspace: u64,
        turbo_workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        let s = &self.shape;
        let local = step.plan.local_lens(step.rank);
        let want = (s.heads_q, s.heads_kv, s.head_dim, s.dtype, 1usize, false);
        let got = (
            plan.heads_q(),
            plan.heads_kv(),
            plan.head_dim(),
            plan.dtype(),
            s.seqlen_q,
            s.causal,
        );
        if got != want || plan.appends() || plan.lens_after() != local.as_slice() {
            return Err(CudaError::Plan(format!(
                "a TurboAttention decode of {} query / {} KV heads, d {}, {:?}, over {:?} tokens \
                 (append: {}) for rank {} of a CP step of shape {:?} (one query token, not \
                 causal) whose local lengths are {local:?}",
                plan.heads_q(),
                plan.heads_kv(),
                plan.head_dim(),
                plan.dtype(),
                plan.lens_after(),
                plan.appends(),
                step.rank,
                s
            )));
        }
        let block = self.partial_block(step, workspace);
        let lse = block + step.layout.lse_offset as u64;
        if local.iter().all(|&l| l == 0) {
            // SAFETY: lse is this rank's partial block's LSE, as the caller promises
            return unsafe { self.write_empty_partial(lse, stream) };
        }
        unsafe {
            turbo.decode(
                plan,
                cfg,
                q,
                block,
                lse,
                softmax_scale,
                cache,
                turbo_workspace,
                stream,
            )
        }
    }

    /// TurboQuant decode of this rank's slice into its partial block, in place of
    /// [`CpRank::attend`]: `cache` holds this rank's keys of every sequence (compressed by its own
    /// appends; TurboQuant compresses each token alone, so any split works), `prep` a
    /// [`TurboQuantCuda::prepare_decode`] of one query token per sequence over the CP plan's
    /// local lengths. A sequence with no key here gives an empty row (LSE `-inf`), which
    /// [`CpRank::merge`] skips; a rank with no key at all writes only `-inf`. TurboQuant's O is
    /// normalised f16 and its LSE natural-log f32, in the Lean layout, so the partials merge like
    /// Lean's (f16 steps only: TurboQuant's kernels are f16).
    ///
    /// # Safety
    /// As for [`CpRank::run`] for `q` (f16 `[B, 1, Hq, D]`) and `workspace`.
    #[allow(clippy::too_many_arguments)] // the decode's own objects beside the CP step's
    pub unsafe fn attend_turboquant(
        &self,
        step: &CpStepPlan,
        tq: &TurboQuantCuda,
        prep: &PreparedTurboQuantDecode,
        q: u64,
        cache: &DeviceTurboQuantCache,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        let s = &self.shape;
        let local = step.plan.local_lens(step.rank);
        let p = &prep.problem;
        let want = (s.heads_q, s.heads_kv, s.head_dim, s.dtype, 1usize, false);
        let got = (
            p.heads_q,
            p.heads_kv,
            p.head_dim_qk,
            p.dtype,
            p.max_seqlen_q,
            p.causal,
        );
        if got != want || p.head_dim_v != s.head_dim || p.seqlens_k != local {
            return Err(CudaError::Plan(format!(
                "a TurboQuant decode of {} query / {} KV heads, d {}, {:?}, {} query tokens \
                 (causal: {}) over {:?} tokens for rank {} of a CP step of shape {:?} (one \
                 query token, not causal) whose local lengths are {local:?}",
                p.heads_q,
                p.heads_kv,
                p.head_dim_qk,
                p.dtype,
                p.max_seqlen_q,
                p.causal,
                p.seqlens_k,
                step.rank,
                s
            )));
        }
        if tq.gpu().ordinal != self.comm.gpu().ordinal {
            return Err(CudaError::Plan(format!(
                "TurboQuant kernels of GPU {} for rank {} on GPU {}",
                tq.gpu().ordinal,
                step.rank,
                self.comm.gpu().ordinal
            )));
        }
        let block = self.partial_block(step, workspace);
        let lse = block + step.layout.lse_offset as u64;
        if local.iter().all(|&l| l == 0) {
            // SAFETY: lse is this rank's partial block's LSE, as the caller promises
            return unsafe { self.write_empty_partial(lse, stream) };
        }
        // SAFETY: q as the caller promises; the block holds O and LSE of this shape
        // (CpLayout), 16-byte aligned.
        unsafe { tq.enqueue_decode(prep, q, cache, block, lse, stream) }
    }

    /// The exchange: in-place all-gather of the partial blocks, or all-reduce (max) of LSE,
    /// scaling and reduce-scatter (sum) by heads.
    ///
    /// # Safety
    /// As for [`CpRank::run`]; this rank's partial block holds its partial (written by
    /// [`CpRank::attend`] or another decode earlier on `stream`).
    pub unsafe fn exchange(
        &self,
        step: &CpStepPlan,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        let l = &step.layout;
        let s = &self.shape;
        let parts = workspace + l.parts as u64;
        match step.plan.exchange {
            Exchange::AllGather => unsafe {
                self.comm.all_gather(
                    self.partial_block(step, workspace),
                    parts,
                    l.block_bytes,
                    Element::Byte,
                    stream,
                )
            },
            Exchange::ReduceScatterHeads => {
                let gmax = workspace + l.gmax as u64;
                unsafe {
                    self.comm.all_reduce(
                        parts + l.lse_offset as u64,
                        gmax,
                        s.rows(),
                        Element::F32,
                        Reduce::Max,
                        stream,
                    )?;
                }
                let mut prm = ScaleParams {
                    part: parts,
                    gmax,
                    scaled: workspace + l.scaled as u64,
                    lse_offset: l.lse_offset as u64,
                    batch: s.batch as i32,
                    sq: s.seqlen_q as i32,
                    hq: s.heads_q as i32,
                    d: s.head_dim as i32,
                };
                unsafe {
                    launch_rows(
                        self.comm.gpu(),
                        &self.kernels.scale,
                        s.rows(),
                        &mut prm,
                        stream,
                    )?;
                    self.comm.reduce_scatter(
                        workspace + l.scaled as u64,
                        workspace + l.summed as u64,
                        s.rows() / step.plan.ranks * (s.head_dim + 1),
                        Element::F32,
                        Reduce::Sum,
                        stream,
                    )
                }
            }
        }
    }

    /// The merge (all-gather) or the finishing pass (reduce-scatter) into `t.o` and `t.lse`.
    ///
    /// # Safety
    /// As for [`CpRank::run`]; [`CpRank::exchange`] of this step was enqueued before on `stream`.
    pub unsafe fn merge(
        &self,
        step: &CpStepPlan,
        t: &CpTensors,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        self.check(step)?;
        let l = &step.layout;
        let s = &self.shape;
        let (h0, nh) = step.output_heads();
        let out_rows = s.batch * s.seqlen_q * nh;
        match step.plan.exchange {
            Exchange::AllGather => {
                let parts = workspace + l.parts as u64;
                let g = GatheredPartials {
                    o: parts,
                    o_stride: l.block_bytes as u64,
                    lse: parts + l.lse_offset as u64,
                    lse_stride: l.block_bytes as u64,
                };
                unsafe {
                    self.kernels.merge_gathered(
                        self.comm.gpu(),
                        s,
                        &g,
                        &step.plan.merge_order,
                        (h0, nh),
                        (t.o, t.lse),
                        stream,
                    )
                }
            }
            Exchange::ReduceScatterHeads => {
                let mut prm = FinishParams {
                    summed: workspace + l.summed as u64,
                    gmax: workspace + l.gmax as u64,
                    o: t.o,
                    lse: t.lse,
                    batch: s.batch as i32,
                    sq: s.seqlen_q as i32,
                    hq: s.heads_q as i32,
                    d: s.head_dim as i32,
                    h0: h0 as i32,
                    nh: nh as i32,
                };
                unsafe {
                    launch_rows(
                        self.comm.gpu(),
                        &self.kernels.finish,
                        out_rows,
                        &mut prm,
                        stream,
                    )
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_structs_match_the_kernel_layout() {
        // 6 pointers/u64, 8 ints, the order array (see cp_merge.cu)
        assert_eq!(
            std::mem::size_of::<MergeParams>(),
            6 * 8 + 8 * 4 + MAX_RANKS * 4
        );
        assert_eq!(std::mem::size_of::<ScaleParams>(), 4 * 8 + 4 * 4);
        assert_eq!(std::mem::size_of::<FinishParams>(), 4 * 8 + 6 * 4);
    }
}
